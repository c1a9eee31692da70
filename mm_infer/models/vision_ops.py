"""Vision-tower attention helpers (per-frame segments); rope, patch embed and merge live in kernels/."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def cu_seqlens_from_grid(grid_thw: Tensor) -> Tensor:
    """[F+1] int32 boundaries, one segment per frame (h*w patches each): no cross-item attention."""
    seqlens = torch.repeat_interleave(grid_thw[:, 1] * grid_thw[:, 2], grid_thw[:, 0])  # [F]
    return F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor) -> Tensor:
    """Block-diagonal non-causal attention. q, k, v [P, H, d] -> [P, H, d]."""
    bounds = cu_seqlens.tolist()
    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        qs, ks, vs = (x[start:end].transpose(0, 1) for x in (q, k, v))  # [H, L, d]
        o = F.scaled_dot_product_attention(qs, ks, vs, scale=scale)  # [H, L, d]
        out[start:end] = o.transpose(0, 1)
    return out
