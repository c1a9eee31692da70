"""Mamba-2 conv and scan over a step's segments (one per sequence) in one launch each, states read from and written
beside a slot pool: the Triton launchers of the CUDA path and the torch references they are tested against."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from mm_infer_kernels import _triton


@dataclass(frozen=True)
class Segments:
    """Device metadata of a step's S segments: rows [starts, starts+lens) of the batch, the absolute position of
    the first, the prompt length (tokens before it clamp dt), the pool slot to start from (-1: zeros), each [S];
    and snaps [S, M]: the token counts after which the state is also kept (0: none; output row s * M + m)."""

    starts: Tensor
    lens: Tensor
    pos0: Tensor
    prompt: Tensor
    read: Tensor
    snaps: Tensor

    @staticmethod
    def build(rows: list[tuple[int, int, int, int, int]], snaps: list[list[int]], device: torch.device) -> Segments:
        """(start row, length, first position, prompt length, read slot or -1) and the snapshot offsets of each."""
        cols = torch.tensor(rows, dtype=torch.int64).reshape(-1, 5).t().contiguous()
        per = max([len(s) for s in snaps] + [1])
        table = torch.tensor([list(s) + [0] * (per - len(s)) for s in snaps], dtype=torch.int64).reshape(-1, per)
        return Segments(*(c.to(device) for c in cols), table.to(device))

    @property
    def per(self) -> int:  # M: snapshot rows per segment
        return self.snaps.shape[1]

    def host(self) -> list[tuple[int, int, int, int, int, list[int]]]:
        return list(zip(*(t.tolist() for t in (self.starts, self.lens, self.pos0, self.prompt, self.read,
                                                  self.snaps)), strict=True))


def conv_reference(x: Tensor, weight: Tensor, bias: Tensor | None, pool: Tensor, seg: Segments
                   ) -> tuple[Tensor, Tensor, Tensor]:
    """x [N, C], weight [C, K], pool [slots, C, K-1] -> (SiLU(conv) [N, C], last K-1 inputs [S, C, K-1], the same
    at each snapshot offset [S*M, C, K-1]); rows outside every segment stay zero."""
    k = weight.shape[1]
    out = torch.zeros_like(x)
    final = x.new_zeros(len(seg.starts), x.shape[1], k - 1)
    snaps = x.new_zeros(len(seg.starts) * seg.per, x.shape[1], k - 1)
    for i, (start, length, _, _, read, offsets) in enumerate(seg.host()):
        before = pool[read] if read >= 0 else x.new_zeros(x.shape[1], k - 1)
        window = torch.cat([before, x[start:start + length].t()], dim=1)  # [C, K-1+L]
        conv = F.conv1d(window[None].float(), weight[:, None].float(), None if bias is None else bias.float(),
                        groups=x.shape[1])[0]  # [C, L]
        out[start:start + length] = F.silu(conv).t().to(x.dtype)
        final[i] = window[:, -(k - 1):]
        for m, snap in enumerate(offsets):
            if snap > 0:
                snaps[i * seg.per + m] = window[:, snap:snap + k - 1]
    return out, final, snaps


def scan_reference(x: Tensor, dt: Tensor, dt_bias: Tensor, a_log: Tensor, b: Tensor, c: Tensor, d: Tensor,
                   pool: Tensor, seg: Segments, dt_min: float) -> tuple[Tensor, Tensor, Tensor]:
    """The recurrence token by token: x [N, H, P], dt [N, H] before softplus and bias, b/c [N, G, NS], pool
    [slots, H, P, NS] float32 -> (y [N, H, P] float32 with the D skip, final states [S, H, P, NS], snapshots)."""
    h, g = x.shape[1], b.shape[1]
    a = -torch.exp(a_log.float())  # [H]
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    final = torch.zeros(len(seg.starts), *pool.shape[1:], dtype=torch.float32, device=x.device)
    snaps = torch.zeros(len(seg.starts) * seg.per, *pool.shape[1:], dtype=torch.float32, device=x.device)
    for i, (start, length, pos0, prompt, read, offsets) in enumerate(seg.host()):
        state = pool[read].clone() if read >= 0 else torch.zeros_like(final[i])
        for t in range(length):
            row = start + t
            step = F.softplus(dt[row].float() + dt_bias.float())  # [H]
            if pos0 + t < prompt:
                step = step.clamp(min=dt_min)
            bb = b[row].float().repeat_interleave(h // g, dim=0)  # [H, NS]
            cc = c[row].float().repeat_interleave(h // g, dim=0)
            xx = x[row].float()  # [H, P]
            state = state * torch.exp(step * a)[:, None, None] + (step[:, None] * xx)[..., None] * bb[:, None, :]
            y[row] = torch.einsum("hpn,hn->hp", state, cc) + d.float()[:, None] * xx
            for m, snap in enumerate(offsets):
                if t + 1 == snap:
                    snaps[i * seg.per + m] = state
        final[i] = state
    return y, final, snaps


def conv_triton(x: Tensor, weight: Tensor, bias: Tensor | None, pool: Tensor, seg: Segments
                ) -> tuple[Tensor, Tensor, Tensor]:
    """conv_reference in one launch: a program per (segment, channel block)."""
    assert x.stride(1) == 1 and pool.stride(2) == 1 and weight.is_contiguous(), "unit inner strides"
    n_seg, (_, channels), k = len(seg.starts), x.shape, weight.shape[1]
    out = torch.zeros_like(x)
    final = x.new_zeros(n_seg, channels, k - 1)
    snaps = x.new_zeros(n_seg * seg.per, channels, k - 1)
    if n_seg == 0:
        return out, final, snaps
    jit = _triton.load("_mamba_triton", x, pool)
    block_c = 64
    jit.mamba_conv_kernel[(n_seg, -(-channels // block_c))](
        x, weight, bias if bias is not None else weight, pool, out, final, snaps, seg.starts, seg.lens, seg.read,
        seg.snaps, x.stride(0), out.stride(0), pool.stride(0), pool.stride(1), final.stride(0), final.stride(1),
        channels, K=k, HAS_BIAS=bias is not None, BLOCK_T=16, BLOCK_C=block_c, SNAPS=seg.per)
    return out, final, snaps


def scan_triton(x: Tensor, dt: Tensor, dt_bias: Tensor, a_log: Tensor, b: Tensor, c: Tensor, d: Tensor,
                pool: Tensor, seg: Segments, dt_min: float) -> tuple[Tensor, Tensor, Tensor]:
    """scan_reference in one launch: a program per (segment, head, P block)."""
    x, dt, b, c = (t.contiguous() for t in (x, dt, b, c))
    assert pool.is_contiguous() and pool.dtype == torch.float32, "the pool's ssm states are float32, contiguous"
    n_seg, (_, heads, p) = len(seg.starts), x.shape
    groups, ns = b.shape[1], b.shape[2]
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    final = torch.zeros(n_seg, *pool.shape[1:], dtype=torch.float32, device=x.device)
    snaps = torch.zeros(n_seg * seg.per, *pool.shape[1:], dtype=torch.float32, device=x.device)
    if n_seg == 0:
        return y, final, snaps
    jit = _triton.load("_mamba_triton", x, pool)
    block_p = min(_triton.next_power_of_2(p), 32)
    jit.mamba_scan_kernel[(n_seg, heads, -(-p // block_p))](
        x, dt, dt_bias, a_log, b, c, d, pool, y, final, snaps, seg.starts, seg.lens, seg.pos0, seg.prompt,
        seg.read, seg.snaps, float(dt_min), heads, p, ns, heads // groups,
        BLOCK_P=block_p, BLOCK_N=_triton.next_power_of_2(ns), SNAPS=seg.per)
    return y, final, snaps
