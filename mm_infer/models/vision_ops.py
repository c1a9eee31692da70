"""Vision-tower attention helpers (per-frame segments); rope, patch embed and merge live in kernels/."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def cu_seqlens_from_grid(grid: list[list[int]]) -> list[int]:
    """[F+1] boundaries (host ints), one segment per frame (h*w patches each): no cross-item attention."""
    bounds = [0]
    for t, h, w in grid:
        for _ in range(t):
            bounds.append(bounds[-1] + h * w)
    return bounds


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, bounds: list[int]) -> Tensor:
    """Block-diagonal non-causal attention over segments [bounds[i], bounds[i+1]). q, k, v [P, H, d] -> [P, H, d]."""
    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        qs, ks, vs = (x[start:end].transpose(0, 1) for x in (q, k, v))  # [H, L, d]
        o = F.scaled_dot_product_attention(qs, ks, vs, scale=scale)  # [H, L, d]
        out[start:end] = o.transpose(0, 1)
    return out
