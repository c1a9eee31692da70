"""Shared building blocks: RMSNorm, SwiGLU MLP, activations and rotary (RoPE / M-RoPE) helpers."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mm_infer.models.half_linear import Linear


def quick_gelu(x: Tensor) -> Tensor:
    """HF's `x * sigmoid(1.702 * x)`; without autograd in one buffer (products commute: the same bits)."""
    if torch.is_grad_enabled():
        return x * torch.sigmoid(1.702 * x)
    return (1.702 * x).sigmoid_().mul_(x)


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "quick_gelu": quick_gelu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def activation(name: str) -> Callable[[Tensor], Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r}; known: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class RMSNorm(nn.Module):
    """y = w * (x / rms(x)), normalised in float32 and cast back before the weight (as HF Qwen2)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:  # [..., D] -> [..., D]
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class FusedLinear(Linear):
    """Several projections of one input as one GEMM: output rows are the parts' rows back to back.

    The checkpoint keeps the parts as separate tensors (q/k/v, gate/up); the loader writes each into its rows.
    """

    def __init__(self, dim: int, part_sizes: tuple[int, ...], bias: bool) -> None:
        super().__init__(dim, sum(part_sizes), bias=bias)
        self.part_sizes = part_sizes

    def part_rows(self, part: int) -> tuple[int, int]:
        """(first row, row count) of part `part`."""
        return sum(self.part_sizes[:part]), self.part_sizes[part]

    def forward_parts(self, x: Tensor) -> tuple[Tensor, ...]:  # [N, D] -> one [N, size] view per part
        return self(x).split(list(self.part_sizes), dim=-1)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); SwiGLU when act is silu. gate and up run as one fused GEMM."""

    def __init__(self, dim: int, hidden: int, act: str = "silu", bias: bool = False) -> None:
        super().__init__()
        self.gate_up_proj = FusedLinear(dim, (hidden, hidden), bias=bias)
        self.down_proj = Linear(hidden, dim, bias=bias)
        self.act = activation(act)

    def forward(self, x: Tensor) -> Tensor:  # [N, D] -> [N, D]
        gate, up = self.gate_up_proj.forward_parts(x)  # [N, H] each
        return self.down_proj(self.act(gate) * up)


def rope_inv_freq(theta: float, dim: int) -> Tensor:
    """[dim/2] float32 inverse frequencies, computed exactly as HF does."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float, device="cpu") / dim))


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [N, H, d]; cos/sin: [N, d] (broadcast over heads). HF's `x * cos + rotate_half(x) * sin`, computed
    without the rotated copy: the half products are subtracted and added in place, which rounds identically
    ((-a) * s == -(a * s), and b + (-c) == b - c)."""
    half = x.shape[-1] // 2
    cos, sin = cos[:, None, :], sin[:, None, :]  # [N, 1, d]
    out = x * cos  # [N, H, d]
    out[..., :half] -= x[..., half:] * sin[..., :half]
    out[..., half:] += x[..., :half] * sin[..., half:]
    return out


def mrope_cos_sin(
    positions: Tensor, inv_freq: Tensor, mrope_section: tuple[int, ...], dtype: torch.dtype,
    interleaved: bool = False,
) -> tuple[Tensor, Tensor]:
    """positions [3, N] (t, h, w) -> cos, sin [N, head_dim] in `dtype`.

    Frequency chunk i of sizes `mrope_section` takes its angle from position row i % 3; the
    chunks are concatenated and then duplicated to cover both rotate_half halves. Interleaved
    (Qwen3-VL): frequency j takes row h if j % 3 == 1 and j < 3 * section[1], w likewise with
    j % 3 == 2, else t (plain slices, as HF: no index tensor, so CUDA-graph safe).
    """
    freqs = positions[..., None].float() * inv_freq.to(positions.device)  # [3, N, d/2]
    if interleaved:
        mixed = freqs[0].clone()  # [N, d/2]
        for axis in (1, 2):
            mixed[:, axis:3 * mrope_section[axis]:3] = freqs[axis, :, axis:3 * mrope_section[axis]:3]
        freqs = mixed
    else:
        chunks = freqs.split(list(mrope_section), dim=-1)
        freqs = torch.cat([c[i % 3] for i, c in enumerate(chunks)], dim=-1)  # [N, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [N, d]
    return emb.cos().to(dtype), emb.sin().to(dtype)
