"""Nemotron-H's MoE: a float32 sigmoid router with group-limited top-k and a selection-only bias, non-gated relu^2
experts, and an unscaled shared expert (HF's NemotronHMoE / NemotronHTopkRouter)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mm_infer.models.half_linear import Linear, linear


@dataclass(frozen=True)
class NemotronMoEConfig:
    num_experts: int
    top_k: int
    intermediate: int
    shared_intermediate: int
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    latent: int | None = None
    mlp_bias: bool = False


def relu2(x: Tensor) -> Tensor:
    return torch.square(F.relu(x))


class ReluSquaredMLP(nn.Module):
    """down(relu(up(x))^2), no gate (Nemotron-H's MLP layers and shared expert)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.up_proj = Linear(hidden, intermediate, bias=bias)
        self.down_proj = Linear(intermediate, hidden, bias=bias)

    def forward(self, x: Tensor) -> Tensor:  # [N, D] -> [N, D]
        return self.down_proj(relu2(self.up_proj(x)))


class NemotronRouter(nn.Module):
    """float32 logits -> sigmoid scores; the correction bias picks experts (within the best topk_group groups)
    but the weights are the plain scores, renormalised, times routed_scaling_factor."""

    def __init__(self, hidden: int, cfg: NemotronMoEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.weight = nn.Parameter(torch.zeros(cfg.num_experts, hidden, dtype=torch.float32))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(cfg.num_experts, dtype=torch.float32))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [N, D] -> (weights [N, k] float32, expert ids [N, k])."""
        cfg = self.cfg
        scores = F.linear(x.float(), self.weight.float()).sigmoid()  # [N, E]
        choice = scores + self.e_score_correction_bias
        per_group = choice.view(-1, cfg.n_group, cfg.num_experts // cfg.n_group)  # [N, G, E/G]
        group_scores = per_group.topk(2, dim=-1).values.sum(-1)  # [N, G]
        groups = torch.topk(group_scores, cfg.topk_group, dim=-1, sorted=False).indices
        keep = torch.zeros_like(group_scores).scatter_(1, groups, 1.0).bool()  # [N, G]
        dropped = keep[..., None].expand_as(per_group).reshape_as(choice).logical_not()  # [N, E]
        choice = choice.masked_fill(dropped, float("-inf"))
        experts = torch.topk(choice, cfg.top_k, dim=-1, sorted=False).indices  # [N, k]
        weights = scores.gather(1, experts)
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * cfg.routed_scaling_factor, experts


class NemotronMoE(nn.Module):
    def __init__(self, hidden: int, cfg: NemotronMoEConfig) -> None:
        super().__init__()
        inner = cfg.latent or hidden
        self.gate = NemotronRouter(hidden, cfg)
        self.min_group_rows = 0  # > 0 (the engine's CPU batch_invariant): each expert's GEMMs padded to this many rows
        self.up_proj = nn.Parameter(torch.empty(cfg.num_experts, cfg.intermediate, inner))  # [E, I, D]
        self.down_proj = nn.Parameter(torch.empty(cfg.num_experts, inner, cfg.intermediate))  # [E, D, I]
        self.shared_experts = ReluSquaredMLP(hidden, cfg.shared_intermediate, cfg.mlp_bias)
        self.fc1_latent_proj = Linear(hidden, cfg.latent, bias=cfg.mlp_bias) if cfg.latent else None
        self.fc2_latent_proj = Linear(cfg.latent, hidden, bias=cfg.mlp_bias) if cfg.latent else None

    @property
    def part_sizes(self) -> tuple[int, ...]:  # a released checkpoint stores each expert alone: one part per expert
        return (1,) * self.up_proj.shape[0]

    def part_rows(self, part: int) -> tuple[int, int]:
        """(first row, row count) of expert `part` in up_proj / down_proj [E, ...]."""
        return part, 1

    def forward(self, x: Tensor) -> Tensor:  # [N, D] -> [N, D]
        weights, experts = self.gate(x)
        h = self.fc1_latent_proj(x) if self.fc1_latent_proj is not None else x
        k = experts.shape[1]
        flat = experts.reshape(-1)  # [N*k]
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.up_proj.shape[0]).tolist()
        out = torch.zeros(h.shape, dtype=torch.float32, device=h.device)  # float32 sum over the k experts (HF)
        for e, rows in enumerate(torch.split(order, counts)):
            if rows.numel() == 0:
                continue
            tok = rows // k
            part = h[tok]  # [n_e, D]
            if part.shape[0] < self.min_group_rows:  # row-invariant GEMMs: the result cannot depend on n_e
                part = torch.cat([part, part.new_zeros(self.min_group_rows - part.shape[0], part.shape[1])])
            y = linear(relu2(linear(part, self.up_proj[e])), self.down_proj[e])[:tok.shape[0]]  # [n_e, D]
            out.index_add_(0, tok, (y * weights.reshape(-1)[rows, None]).to(out.dtype))
        routed = out.to(h.dtype)
        if self.fc2_latent_proj is not None:
            routed = self.fc2_latent_proj(routed)
        return routed + self.shared_experts(x)
