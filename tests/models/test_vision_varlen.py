"""Vision attention over segments: one call per run of equal-length segments equals one call per segment."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mm_infer.models import vision_ops
from mm_infer.models.vision_ops import per_segment_attention, varlen_attention


def _qkv(p: int, heads: int = 4, d: int = 16, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(p, heads, d, generator=g) for _ in range(3))


@pytest.mark.parametrize("bounds", [
    [0, 64, 128, 192, 240, 256],  # Qwen2.5-VL-like windows: full ones and ragged edges
    [0, 16, 32, 48, 64],  # frames of one video: one length
    [0, 7, 20, 27, 40, 41],  # odd lengths, a 1-patch segment, lengths repeating out of order
    [0, 5, 10, 15, 30, 45, 50],  # runs of 5s and 15s
])
def test_batched_by_length_equals_per_segment(bounds: list[int]) -> None:
    q, k, v = _qkv(bounds[-1])
    got = varlen_attention(q, k, v, bounds)
    want = per_segment_attention(q, k, v, bounds)
    assert torch.equal(got, want)  # each (segment, head) computed as alone: the same bits


def test_one_sdpa_call_per_run_of_equal_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []
    sdpa = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(tuple(args[0].shape))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(vision_ops.F, "scaled_dot_product_attention", counting)
    bounds = [0] + [64 * i for i in range(1, 38)] + [64 * 37 + 16, 64 * 37 + 32, 64 * 38 + 32]  # 37x64, 2x16, 64
    q, k, v = _qkv(bounds[-1])
    varlen_attention(q, k, v, bounds)
    assert calls == [(37, 4, 64, 16), (2, 4, 16, 16), (1, 4, 64, 16)]  # one call per run of equal lengths


def test_segments_never_see_each_other() -> None:
    q, k, v = _qkv(32)
    bounds = [0, 16, 32]
    base = varlen_attention(q, k, v, bounds)
    v2 = v.clone()
    v2[16:] += 100.0  # change only the second segment's values
    again = varlen_attention(q, k, v2, bounds)
    assert torch.equal(base[:16], again[:16]) and not torch.equal(base[16:], again[16:])
