"""Vision-tower attention helpers (per-frame segments); rope, patch embed and merge live in mm_infer_kernels/."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mm_infer.models.attention import equal_runs


def cu_seqlens_from_grid(grid: list[list[int]]) -> list[int]:
    """[F+1] boundaries (host ints), one segment per frame (h*w patches each): no cross-item attention."""
    bounds = [0]
    for t, h, w in grid:
        for _ in range(t):
            bounds.append(bounds[-1] + h * w)
    return bounds


def per_segment_attention(q: Tensor, k: Tensor, v: Tensor, bounds: list[int]) -> Tensor:
    """The reference: one 4-D SDPA call per segment [bounds[i], bounds[i+1]), as HF's vision attention makes them.
    q, k, v [P, H, d] -> [P, H, d]."""
    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        qs, ks, vs = (x[start:end].transpose(0, 1)[None] for x in (q, k, v))  # [1, H, L, d]
        out[start:end] = F.scaled_dot_product_attention(qs, ks, vs, scale=scale)[0].transpose(0, 1)
    return out


def equal_length_runs(bounds: list[int]) -> list[tuple[int, int, int]]:
    """(start, length, count) of each maximal run of consecutive segments of one length (host ints)."""
    lengths = [end - start for start, end in zip(bounds[:-1], bounds[1:], strict=True)]
    return [(bounds[first], lengths[first], count) for first, count in equal_runs(lengths)]


def _flash_varlen(q: Tensor, k: Tensor, v: Tensor, bounds: list[int]) -> Tensor | None:
    """torch's flash varlen kernel (CUDA, half precision) in one call, or None where it cannot run."""
    if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
        return None
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    cu = torch.tensor(bounds, dtype=torch.int32).to(q.device, non_blocking=True)  # [S+1]
    longest = max(b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True))
    return varlen_attn(q, k, v, cu, cu, longest, longest, scale=q.shape[-1] ** -0.5)


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, bounds: list[int]) -> Tensor:
    """Block-diagonal non-causal attention over segments [bounds[i], bounds[i+1]). q, k, v [P, H, d] -> [P, H, d].

    One flash varlen call on CUDA in half precision. Elsewhere one batched 4-D SDPA call per run of consecutive
    equal-length segments, on views (no gather): a Qwen2-VL image's frames are one run, Qwen2.5-VL's windows a few
    runs per image (its ragged edge windows split them); each (segment, head) is computed as alone."""
    if (flash := _flash_varlen(q, k, v, bounds)) is not None:
        return flash
    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    for start, length, n in equal_length_runs(bounds):
        end = start + n * length
        qs, ks, vs = (x[start:end].view(n, length, *x.shape[1:]).transpose(1, 2) for x in (q, k, v))  # [n, H, L, d]
        o = F.scaled_dot_product_attention(qs, ks, vs, scale=scale)  # [n, H, L, d]
        out[start:end].view(n, length, *q.shape[1:]).copy_(o.transpose(1, 2))
    return out
