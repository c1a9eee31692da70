"""The gated delta rule (Qwen3.5's DeltaNet) over a step's segments in one launch, states read from and written
beside a slot pool: the Triton launcher of the CUDA path and the torch reference it is tested against."""

from __future__ import annotations

import torch
from torch import Tensor

from mm_infer_kernels import _triton
from mm_infer_kernels.mamba_segments import Segments


def gated_delta_reference(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, pool: Tensor,
                          seg: Segments) -> tuple[Tensor, Tensor, Tensor]:
    """Token by token: q/k [N, H, DK] (normed, q scaled), v [N, H, DV], g/beta [N, H], pool [slots, H, DK, DV]
    float32 -> (o [N, H, DV] float32, final states [S, H, DK, DV], states after each snapshot offset [S*M, ...])."""
    o = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    final = torch.zeros(len(seg.starts), *pool.shape[1:], dtype=torch.float32, device=v.device)
    snaps = torch.zeros(len(seg.starts) * seg.per, *pool.shape[1:], dtype=torch.float32, device=v.device)
    for i, (start, length, _, _, read, offsets) in enumerate(seg.host()):
        state = pool[read].clone() if read >= 0 else torch.zeros_like(final[i])  # [H, DK, DV]
        for t in range(length):
            row = start + t
            state = state * g[row].float().exp()[:, None, None]
            remembered = (state * k[row].float()[..., None]).sum(dim=-2)  # [H, DV]
            delta = (v[row].float() - remembered) * beta[row].float()[:, None]
            state = state + k[row].float()[..., None] * delta[:, None, :]
            o[row] = (state * q[row].float()[..., None]).sum(dim=-2)
            for m, snap in enumerate(offsets):
                if t + 1 == snap:
                    snaps[i * seg.per + m] = state
        final[i] = state
    return o, final, snaps


def gated_delta_triton(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, pool: Tensor,
                       seg: Segments) -> tuple[Tensor, Tensor, Tensor]:
    """gated_delta_reference in one launch: a program per (segment, value head, dv block)."""
    q, k, v, g, beta = (t.float().contiguous() for t in (q, k, v, g, beta))
    assert pool.is_contiguous() and pool.dtype == torch.float32, "the pool's states are float32, contiguous"
    n_seg, (_, heads, dk), dv = len(seg.starts), q.shape, v.shape[2]
    o = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    final = torch.zeros(n_seg, *pool.shape[1:], dtype=torch.float32, device=v.device)
    snaps = torch.zeros(n_seg * seg.per, *pool.shape[1:], dtype=torch.float32, device=v.device)
    if n_seg == 0:
        return o, final, snaps
    jit = _triton.load("_gated_delta_triton", q, pool)
    block_v = min(_triton.next_power_of_2(dv), 32)
    jit.gated_delta_kernel[(n_seg, heads, -(-dv // block_v))](
        q, k, v, g, beta, pool, o, final, snaps, seg.starts, seg.lens, seg.read, seg.snaps, heads, dk, dv,
        BLOCK_K=_triton.next_power_of_2(dk), BLOCK_V=block_v, SNAPS=seg.per)
    return o, final, snaps
