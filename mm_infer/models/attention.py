"""The LM's attention seam: an AttentionContext protocol and a cache-free dense causal implementation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor


@runtime_checkable
class AttentionContext(Protocol):
    """Per-batch attention for flat, unpadded token batches; the engine backs it with a paged KV cache."""

    def attend(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q [N, Hq, d], k/v [N, Hkv, d] (q, k already rotated) -> [N, Hq, d]."""
        ...


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal GQA attention for one sequence whose queries are its last q.shape[0] keys.

    q [Lq, Hq, d], k/v [Lk, Hkv, d] with Lk >= Lq -> [Lq, Hq, d].

    3-D on purpose: on the CPU this is torch's math kernel, whose causal and masked forms give the same bits, so a
    chunk after a prefix-cache hit equals the same rows of a full prefill. A 4-D call takes the flash kernel (2.3x
    faster at 110 tokens) but its causal and masked paths round differently, and hits stop matching misses.
    """
    lq, hq, d = q.shape
    lk, hkv = k.shape[0], k.shape[1]
    rep = hq // hkv
    k = k.repeat_interleave(rep, dim=1)  # [Lk, Hq, d]
    v = v.repeat_interleave(rep, dim=1)
    mask = None
    if lk != lq:  # query i sits at key position lk - lq + i
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
        attn_mask=mask, is_causal=mask is None, scale=d**-0.5,
    )  # [Hq, Lq, d]
    return out.transpose(0, 1)


class DenseAttentionContext:
    """Causal attention run independently on each of several concatenated sequences; no KV cache."""

    def __init__(self, seq_lens: Sequence[int]) -> None:
        self.seq_lens = [int(n) for n in seq_lens]
        if any(n <= 0 for n in self.seq_lens):
            raise ValueError(f"sequence lengths must be positive, got {self.seq_lens}")

    def attend(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if q.shape[0] != sum(self.seq_lens):
            raise ValueError(f"{q.shape[0]} tokens but seq_lens sum to {sum(self.seq_lens)}")
        outs = [
            causal_attention(qs, ks, vs)
            for qs, ks, vs in zip(*(x.split(self.seq_lens) for x in (q, k, v)), strict=True)
        ]
        return torch.cat(outs, dim=0)  # [N, Hq, d]
