"""Qwen3-VL-MoE sparse MLP: softmax top-k router, experts run as grouped GEMMs over tokens sorted by expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mm_infer.models.config import MoEConfig
from mm_infer.models.half_gemm_path import half_gemm_path, mv_for_single_rows
from mm_infer.models.half_linear import HALF_TYPES, Linear, linear
from mm_infer.models.layers import activation
from mm_infer.models.routing_capture import RoutingCapture


def _grouped_mm_ok(x: Tensor, w: Tensor) -> bool:
    """torch's grouped GEMM runs any float dtype on CPU, bfloat16 on CUDA; rows must be 16-byte aligned.

    Half types on a CPU whose half GEMM is slow take the per-expert loop instead: there each group's `linear` runs
    as float32 tiles (half_linear.py), 4x faster than the grouped GEMM at 32 rows per expert (and no slower at 1).
    Where the CPU has native half arithmetic (half_gemm_path "torch"), the grouped GEMM is 2-4x faster than tiles."""
    if not hasattr(F, "grouped_mm"):
        return False
    if x.device.type == "cpu" and x.dtype in HALF_TYPES and half_gemm_path(x.dtype) == "tiles":
        return False
    if x.device.type == "cpu" and x.shape[0] <= w.shape[0] and mv_for_single_rows(x.dtype):
        return False  # about one row per expert: each expert's torch.mv beats the grouped GEMM (1.15x at 16 of 16)
    aligned = all(n * x.element_size() % 16 == 0 for n in (x.shape[1], w.shape[1]))
    return aligned and (x.device.type == "cpu" or (x.is_cuda and x.dtype == torch.bfloat16))


def expert_counts(flat: Tensor, num_experts: int) -> Tensor:
    """[E] long: how many of the flat expert ids [M] name each expert, on their device with no host readback
    (bincount reads the largest id back to size its output; a CUDA graph could not hold that)."""
    return torch.zeros(num_experts, dtype=torch.long, device=flat.device).index_add_(0, flat, torch.ones_like(flat))


def grouped_linear(x: Tensor, w: Tensor, counts: Tensor) -> Tensor:
    """x [M, in] with rows grouped by expert (counts [E] rows each), w [E, out, in] -> [M, out]: one GEMM per group."""
    if _grouped_mm_ok(x, w):
        offs = counts.cumsum(0).to(torch.int32)  # [E] group ends, stays on the device
        return F.grouped_mm(x, w.transpose(1, 2), offs=offs)
    parts = x.split(counts.tolist())  # fallback: one host sync for the group sizes
    return torch.cat([linear(part, w[e]) for e, part in enumerate(parts)])


class Experts(nn.Module):
    """Fused expert weights in HF's in-memory layout: gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I].

    The hub stores them transposed ([E, H, 2I], [E, I, H]); the loader accepts both, as transformers does.
    """

    def __init__(self, num_experts: int, hidden: int, intermediate: int, act: str) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self.act = activation(act)

    def part_count(self, leaf: str) -> int:
        """Per-expert tensors a checkpoint stores for this parameter (Qwen3.5's hub layout): gate and up of each
        expert for gate_up_proj, one per expert for down_proj."""
        return self.gate_up_proj.shape[0] * (2 if leaf == "gate_up_proj" else 1)

    def part_view(self, leaf: str, param: Tensor, part: int) -> Tensor:
        """The rows one per-expert tensor fills: part 2e / 2e+1 are expert e's gate / up [I, H]; down_proj's part e
        is [H, I]."""
        if leaf == "gate_up_proj":
            expert, which = divmod(part, 2)
            rows = param.shape[1] // 2
            return param[expert, which * rows:(which + 1) * rows]
        return param[part]

    def forward(self, x: Tensor, counts: Tensor) -> Tensor:  # x [M, H] grouped by expert -> [M, H]
        gate, up = grouped_linear(x, self.gate_up_proj, counts).chunk(2, dim=-1)  # [M, I] each
        return grouped_linear(self.act(gate) * up, self.down_proj, counts)

    def forward_padded(self, x: Tensor, counts: Tensor, min_rows: int) -> Tensor:  # [M, H] -> [M, H]
        """forward with each expert's group run alone, zero-padded to >= min_rows rows (batch_invariant on CPU).

        CPU GEMMs are row-invariant from 16 rows up, so a token's result no longer depends on how many other
        tokens of the batch chose its expert. One host sync for the group sizes."""
        out = []
        for e, part in enumerate(x.split(counts.tolist())):  # [n_e, H]
            if part.shape[0] == 0:
                continue
            padded = torch.cat([part, part.new_zeros(max(min_rows - part.shape[0], 0), part.shape[1])])
            gate, up = linear(padded, self.gate_up_proj[e]).chunk(2, dim=-1)  # [max(n_e, min_rows), I] each
            out.append(linear(self.act(gate) * up, self.down_proj[e])[:part.shape[0]])
        return torch.cat(out) if out else torch.zeros_like(x)


class SparseMoE(nn.Module):
    """HF's Qwen3VLMoeTextSparseMoeBlock: probs = softmax(gate(x)), top-k renormalised, weighted sum of experts."""

    def __init__(self, hidden: int, cfg: MoEConfig, act: str, layer_idx: int = 0) -> None:
        super().__init__()
        self.top_k, self.num_experts, self.layer_idx = cfg.top_k, cfg.num_experts, layer_idx
        self.min_group_rows = 0  # > 0 (the engine's CPU batch_invariant): experts run as padded per-expert GEMMs
        self.capture: RoutingCapture | None = None  # set by the engine when routed experts are returned (R3)
        self.gate = Linear(hidden, cfg.num_experts, bias=False)  # the router
        self.experts = Experts(cfg.num_experts, hidden, cfg.intermediate_size, act)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [N, H] -> (weights [N, k] in x's dtype, expert ids [N, k])."""
        probs = F.softmax(self.gate(x), dim=-1, dtype=torch.float)  # [N, E]
        weights, experts = torch.topk(probs, self.top_k, dim=-1)  # [N, k]
        if self.capture is not None:
            self.capture.record(self.layer_idx, experts)
        return (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype), experts

    def forward(self, x: Tensor) -> Tensor:  # [N, H] -> [N, H]
        weights, experts = self.route(x)
        flat = experts.reshape(-1)  # [N*k] expert of each (token, slot)
        order = torch.argsort(flat, stable=True)  # slots by expert, tokens ascending within one
        token = order // self.top_k  # [N*k]
        counts = expert_counts(flat, self.num_experts)  # [E]
        grouped = (self.experts(x[token], counts) if not self.min_group_rows
                   else self.experts.forward_padded(x[token], counts, self.min_group_rows))  # [N*k, H]
        rows = grouped * weights.reshape(-1)[order, None]  # [N*k, H]
        return torch.zeros_like(x).index_add_(0, token, rows)
