"""Qwen3-VL-MoE sparse MLP: softmax top-k router, experts run as grouped GEMMs over tokens sorted by expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mm_infer.models.config import MoEConfig
from mm_infer.models.layers import activation


def _grouped_mm_ok(x: Tensor, w: Tensor) -> bool:
    """torch's grouped GEMM runs any float dtype on CPU, bfloat16 on CUDA; rows must be 16-byte aligned."""
    if not hasattr(F, "grouped_mm"):
        return False
    aligned = all(n * x.element_size() % 16 == 0 for n in (x.shape[1], w.shape[1]))
    return aligned and (x.device.type == "cpu" or (x.is_cuda and x.dtype == torch.bfloat16))


def grouped_linear(x: Tensor, w: Tensor, counts: Tensor) -> Tensor:
    """x [M, in] with rows grouped by expert (counts [E] rows each), w [E, out, in] -> [M, out]: one GEMM per group."""
    if _grouped_mm_ok(x, w):
        offs = counts.cumsum(0).to(torch.int32)  # [E] group ends, stays on the device
        return F.grouped_mm(x, w.transpose(1, 2), offs=offs)
    parts = x.split(counts.tolist())  # fallback: one host sync for the group sizes
    return torch.cat([F.linear(part, w[e]) for e, part in enumerate(parts)])


class Experts(nn.Module):
    """Fused expert weights in HF's in-memory layout: gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I].

    The hub stores them transposed ([E, H, 2I], [E, I, H]); the loader accepts both, as transformers does.
    """

    def __init__(self, num_experts: int, hidden: int, intermediate: int, act: str) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self.act = activation(act)

    def forward(self, x: Tensor, counts: Tensor) -> Tensor:  # x [M, H] grouped by expert -> [M, H]
        gate, up = grouped_linear(x, self.gate_up_proj, counts).chunk(2, dim=-1)  # [M, I] each
        return grouped_linear(self.act(gate) * up, self.down_proj, counts)


class SparseMoE(nn.Module):
    """HF's Qwen3VLMoeTextSparseMoeBlock: probs = softmax(gate(x)), top-k renormalised, weighted sum of experts."""

    def __init__(self, hidden: int, cfg: MoEConfig, act: str) -> None:
        super().__init__()
        self.top_k, self.num_experts = cfg.top_k, cfg.num_experts
        self.gate = nn.Linear(hidden, cfg.num_experts, bias=False)  # the router
        self.experts = Experts(cfg.num_experts, hidden, cfg.intermediate_size, act)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [N, H] -> (weights [N, k] in x's dtype, expert ids [N, k])."""
        probs = F.softmax(F.linear(x, self.gate.weight), dim=-1, dtype=torch.float)  # [N, E]
        weights, experts = torch.topk(probs, self.top_k, dim=-1)  # [N, k]
        return (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype), experts

    def forward(self, x: Tensor) -> Tensor:  # [N, H] -> [N, H]
        weights, experts = self.route(x)
        flat = experts.reshape(-1)  # [N*k] expert of each (token, slot)
        order = torch.argsort(flat, stable=True)  # slots by expert, tokens ascending within one
        token = order // self.top_k  # [N*k]
        counts = torch.bincount(flat, minlength=self.num_experts)  # [E]
        rows = self.experts(x[token], counts) * weights.reshape(-1)[order, None]  # [N*k, H]
        return torch.zeros_like(x).index_add_(0, token, rows)
