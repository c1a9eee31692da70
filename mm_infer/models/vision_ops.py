"""Vision-tower ops kept as plain functions so a fused kernel can replace each one by name."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from mm_infer.models.layers import rotate_half

try:  # Triton kernels on CUDA (kernels/ chooses per call; MM_INFER_KERNELS=triton|torch forces one)
    from kernels import dispatch as _kernels
except ImportError:  # no triton on this platform: the torch path below is the whole story
    _kernels = None


def patch_embed(pixel_values: Tensor, weight: Tensor) -> Tensor:
    """Conv3d with stride == kernel as a matmul: pixel_values [P, C*T*ph*pw] @ weight[D, C*T*ph*pw].T -> [P, D]."""
    return pixel_values.to(weight.dtype) @ weight.t()


def vision_position_ids(grid_thw: Tensor, merge: int) -> Tensor:
    """[P, 2] (row, col) patch coordinates in the processor's merge-block-major patch order."""
    out = []
    for t, h, w in grid_thw.tolist():
        hpos = torch.arange(h).unsqueeze(1).expand(h, w)  # [h, w]
        wpos = torch.arange(w).unsqueeze(0).expand(h, w)  # [h, w]
        block = (h // merge, merge, w // merge, merge)
        hpos = hpos.reshape(block).transpose(1, 2).flatten()  # [h*w]
        wpos = wpos.reshape(block).transpose(1, 2).flatten()  # [h*w]
        out.append(torch.stack([hpos, wpos], dim=-1).repeat(t, 1))  # [t*h*w, 2]
    return torch.cat(out, dim=0).to(grid_thw.device)


def vision_rope_cos_sin(position_ids: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
    """position_ids [P, 2] -> float32 cos, sin [P, head_dim]: (h freqs, w freqs) duplicated."""
    freqs = position_ids[..., None].float() * inv_freq.float()  # [P, 2, head_dim/4]
    freqs = torch.cat([freqs[:, 0], freqs[:, 1]], dim=-1)  # [P, head_dim/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [P, head_dim]
    return emb.cos(), emb.sin()


def apply_vision_rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """q, k [P, H, d]; cos, sin [P, d]. Rotation in float32, result in the input dtype."""
    if _kernels is not None and _kernels.select_backend(q, k, cos, sin) == "triton":
        return _kernels.vision_rope(q, k, cos, sin)  # fused Triton kernel, bit-equal to the lines below
    c, s = cos[:, None, :].float(), sin[:, None, :].float()
    q32, k32 = q.float(), k.float()
    q_out = q32 * c + rotate_half(q32) * s
    k_out = k32 * c + rotate_half(k32) * s
    return q_out.to(q.dtype), k_out.to(k.dtype)


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


def merge_patches(x: Tensor, merge: int) -> Tensor:
    """[P, E] -> [P/merge^2, merge^2*E]: each merge x merge block is already contiguous."""
    return x.reshape(-1, merge * merge * x.shape[-1])
