"""The LM's rotary embedding (in place, no rotated copy) rounds exactly as HF's `x * cos + rotate_half(x) * sin`."""

from __future__ import annotations

import pytest
import torch

from mm_infer.models.layers import apply_rotary


def hf_formula(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [16, 128, 80])
def test_in_place_rotary_has_hf_bits(dtype: torch.dtype, head_dim: int) -> None:
    """Each product and sum rounds in the model dtype as HF's does; a fused multiply-add, a swapped half or a
    sign slip would change bits here (values are large so that the products round)."""
    g = torch.Generator().manual_seed(head_dim)
    x = (torch.randn(37, 4, head_dim, generator=g) * 40).to(dtype)
    angles = torch.randn(37, head_dim, generator=g) * 3
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    assert torch.equal(apply_rotary(x, cos, sin), hf_formula(x, cos, sin))


def test_matches_transformers_qwen2_vl() -> None:
    hf = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 2, 32, generator=g, dtype=torch.float32).to(torch.bfloat16)
    angles = torch.randn(9, 32, generator=g)
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    expected = x * cos[:, None, :] + hf.rotate_half(x) * sin[:, None, :]
    assert torch.equal(apply_rotary(x, cos, sin), expected)
