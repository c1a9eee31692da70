"""Nemotron-H's language model (HF `nemotron_h`): a hybrid stack of Mamba-2, attention (no RoPE), relu^2 MLP and
MoE layers, one mixer per layer behind one pre-norm, over flat batches of whole or continued sequences."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from mm_infer.models.attention import AttentionContext, DenseAttentionContext
from mm_infer.models.half_linear import Linear
from mm_infer.models.mamba2 import Mamba2Dims, Mamba2Mixer
from mm_infer.models.nemotron_moe import NemotronMoE, NemotronMoEConfig, ReluSquaredMLP
from mm_infer.models.recurrent_batch import RecurrentBatch, StatePool, fresh_batch

PATTERN = {"M": "mamba", "*": "attention", "E": "moe", "-": "mlp"}  # hybrid_override_pattern's letters
LAYER_NAMES = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "attention",
               "attention": "attention", "moe": "moe", "mlp": "mlp"}  # layers_block_type's names, old and new


@dataclass(frozen=True)
class NemotronHConfig:
    vocab_size: int
    hidden: int
    layers: tuple[str, ...]  # "mamba" | "attention" | "moe" | "mlp", one per layer
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    mamba: Mamba2Dims
    moe: NemotronMoEConfig
    eps: float
    tie_word_embeddings: bool = False
    mlp_bias: bool = False

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> NemotronHConfig:
        """A `nemotron_h` config dict (or its legacy names) as HF 5.24 reads it."""
        g = lambda key, legacy, default: cfg.get(key, cfg.get(legacy, default))  # noqa: E731
        if cfg.get("layers_block_type") is not None:
            layers = tuple(LAYER_NAMES[name] for name in cfg["layers_block_type"])
        else:
            layers = tuple(PATTERN[ch] for ch in cfg.get("hybrid_override_pattern", "ME*-"))
        hidden, eps = cfg["hidden_size"], cfg.get("layer_norm_epsilon", 1e-5)
        mamba = Mamba2Dims(
            hidden, cfg.get("mamba_num_heads", 128), cfg.get("mamba_head_dim", 64), g("n_groups", "mamba_n_groups", 8),
            cfg.get("ssm_state_size", 128), g("conv_kernel", "mamba_d_conv", 4),
            g("chunk_size", "mamba_chunk_size", 128),
            g("time_step_min", "mamba_dt_min", 0.001), eps, cfg.get("use_bias", False),
            g("use_conv_bias", "mamba_conv_bias", True))
        moe = NemotronMoEConfig(
            cfg.get("n_routed_experts", cfg.get("num_local_experts", 8)), cfg.get("num_experts_per_tok", 2),
            cfg.get("moe_intermediate_size", 7688), cfg.get("moe_shared_expert_intermediate_size", 7688),
            cfg.get("n_group", 1), cfg.get("topk_group", 1), cfg.get("norm_topk_prob", True),
            cfg.get("routed_scaling_factor", 1.0), cfg.get("moe_latent_size"), cfg.get("mlp_bias", False))
        return NemotronHConfig(cfg.get("vocab_size", 131072), hidden, layers, cfg.get("num_attention_heads", 32),
                               cfg.get("num_key_value_heads", 8), cfg.get("head_dim", 128),
                               cfg.get("intermediate_size", 21504), mamba, moe, eps,
                               cfg.get("tie_word_embeddings", False), cfg.get("mlp_bias", False))


class NemotronRMSNorm(nn.Module):
    """float32 normalisation, times the float32 weight, then cast (HF NemotronHRMSNorm's order)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x32).to(x.dtype)


class NemotronAttention(nn.Module):
    """q/k/v/o without bias, GQA, no positional encoding: the tokens' order comes from the Mamba layers."""

    def __init__(self, cfg: NemotronHConfig, kv_index: int) -> None:
        super().__init__()
        self.kv_index, self.heads, self.kv_heads, self.head_dim = kv_index, cfg.heads, cfg.kv_heads, cfg.head_dim
        self.q_proj = Linear(cfg.hidden, cfg.heads * cfg.head_dim, bias=False)
        self.k_proj = Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=False)

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:  # [N, D] -> [N, D]
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.heads, self.head_dim)
        k = self.k_proj(x).view(n, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.kv_heads, self.head_dim)
        return self.o_proj(ctx.attend(self.kv_index, q, k, v).reshape(n, -1))


class NemotronBlock(nn.Module):
    def __init__(self, cfg: NemotronHConfig, kind: str, kv_index: int) -> None:
        super().__init__()
        self.kind = kind
        self.norm = NemotronRMSNorm(cfg.hidden, cfg.eps)
        self.mixer: nn.Module = {
            "mamba": lambda: Mamba2Mixer(cfg.mamba),
            "attention": lambda: NemotronAttention(cfg, kv_index),
            "moe": lambda: NemotronMoE(cfg.hidden, cfg.moe),
            "mlp": lambda: ReluSquaredMLP(cfg.hidden, cfg.intermediate, cfg.mlp_bias),
        }[kind]()


class NemotronHModel(nn.Module):
    """Embeddings, the hybrid layers and norm_f; the LM head (float32 logits)."""

    def __init__(self, cfg: NemotronHConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden)
        kv_of = {i: sum(k == "attention" for k in cfg.layers[:i]) for i in range(len(cfg.layers))}
        self.layers = nn.ModuleList(NemotronBlock(cfg, kind, kv_of[i]) for i, kind in enumerate(cfg.layers))
        self.norm_f = NemotronRMSNorm(cfg.hidden, cfg.eps)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(cfg.hidden, cfg.vocab_size, bias=False)

    @property
    def mamba_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.cfg.layers) if kind == "mamba"]

    def state_shapes(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
        return {i: self.layers[i].mixer.state_shapes() for i in self.mamba_layers}

    def state_pool(self, slots: int) -> StatePool:
        """A pool of `slots` recurrent states for every Mamba layer, on the model's device."""
        w = self.embeddings.weight
        return StatePool(self.state_shapes(), slots, w.dtype, w.device)

    def forward_hidden(self, embeds: Tensor, ctx: AttentionContext, states: RecurrentBatch) -> Tensor:
        """embeds [N, D] of the batch's sequences (attention through ctx, Mamba state through `states`, whose
        advanced states are staged for its commit) -> final-normed hidden [N, D]."""
        x = embeds
        for i, layer in enumerate(self.layers):
            h = layer.norm(x)
            if layer.kind == "mamba":
                out = states.run_layer(i, layer.mixer, h)
            elif layer.kind == "attention":
                out = layer.mixer(h, ctx)
            else:
                out = layer.mixer(h)
            x = x + out
        return self.norm_f(x)

    def compute_logits(self, hidden: Tensor) -> Tensor:  # [N, D] -> float32 [N, V]
        weight = self.embeddings.weight if self.lm_head is None else self.lm_head.weight
        return torch.nn.functional.linear(hidden, weight).float()

    def forward(self, input_ids: Tensor, seq_lens: Sequence[int] | None = None) -> Tensor:
        """Whole sequences from scratch (tests, HF parity): input_ids [N] -> float32 logits [N, V]."""
        lens = list(seq_lens) if seq_lens is not None else [input_ids.shape[0]]
        states = fresh_batch(self.state_pool(len(lens)), lens)
        return self.compute_logits(self.forward_hidden(self.embeddings(input_ids), DenseAttentionContext(lens), states))


def our_name(hf_name: str) -> str:
    """An HF NemotronHForCausalLM parameter name (after HF's own renames) -> this model's."""
    name = hf_name.removeprefix("model.")
    return name.replace(".mixer.experts.up_proj", ".mixer.up_proj").replace(".mixer.experts.down_proj",
                                                                           ".mixer.down_proj")
