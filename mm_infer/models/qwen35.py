"""Qwen3.5's hybrid LM (HF `qwen3_5`, `qwen3_5_moe`), as the difference from Qwen3-VL's: gated DeltaNet layers with
their recurrent state beside gated full-attention layers (partial interleaved M-RoPE), zero-centred RMSNorms, and an
MoE with a sigmoid-gated shared expert."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mm_infer.models.attention import AttentionContext
from mm_infer.models.config import ModelConfig, TextConfig
from mm_infer.models.gated_delta import GatedDeltaDims, GatedDeltaNet
from mm_infer.models.half_linear import Linear
from mm_infer.models.language import DeepStack
from mm_infer.models.layers import FusedLinear, GatedMLP, apply_rotary, mrope_cos_sin, rope_inv_freq
from mm_infer.models.moe import SparseMoE
from mm_infer.models.qwen35_config import GDN_CHUNK, Qwen35Config
from mm_infer.models.qwen_names import hf_target
from mm_infer.models.recurrent_batch import RecurrentBatch, StatePool


class ZeroCenteredRMSNorm(nn.Module):
    """(x / rms(x)) * (1 + w) in float32, then cast: the stored weight is centred at 0 (HF Qwen3_5RMSNorm)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:  # [..., D] -> [..., D]
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class GatedAttention(nn.Module):
    """GQA attention whose q_proj also yields a per-head output gate (rows [q_h | gate_h] per head), q/k norms,
    and rotary on the first rotary_dim dims of each head only."""

    def __init__(self, cfg: TextConfig, rotary_dim: int, kv_index: int) -> None:
        super().__init__()
        self.kv_index, self.rotary_dim = kv_index, rotary_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q, kv = 2 * cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = FusedLinear(cfg.hidden_size, (q, kv, kv), bias=cfg.attention_bias)  # HF's q/k/v_proj
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.attention_bias)
        self.q_norm = ZeroCenteredRMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def _rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:  # [N, H, d] -> [N, H, d]
        r = self.rotary_dim
        return torch.cat([apply_rotary(x[..., :r], cos, sin), x[..., r:]], dim=-1)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, ctx: AttentionContext) -> Tensor:  # [N, D] -> [N, D]
        n = x.shape[0]
        qg, k, v = self.qkv_proj.forward_parts(x)
        qg = qg.reshape(n, self.heads, 2 * self.head_dim)
        q, gate = qg[..., :self.head_dim], qg[..., self.head_dim:]  # [N, Hq, d] each
        k = k.reshape(n, self.kv_heads, self.head_dim)
        v = v.reshape(n, self.kv_heads, self.head_dim)
        q, k = self._rotate(self.q_norm(q), cos, sin), self._rotate(self.k_norm(k), cos, sin)
        out = ctx.attend(self.kv_index, q, k, v) * torch.sigmoid(gate)  # [N, Hq, d]
        return self.o_proj(out.reshape(n, -1))


class SharedExpertMoE(SparseMoE):
    """Qwen3-VL-MoE's routed experts plus a shared expert scaled by sigmoid(shared_expert_gate(x)) per token."""

    def __init__(self, hidden: int, cfg: TextConfig, shared: int, layer_idx: int) -> None:
        super().__init__(hidden, cfg.moe, cfg.hidden_act, layer_idx)  # type: ignore[arg-type]
        self.shared_expert = GatedMLP(hidden, shared, cfg.hidden_act)
        self.shared_expert_gate = Linear(hidden, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # [N, D] -> [N, D]
        # batch invariance: the gate's one column as a per-row float32 dot product (a one-column GEMM's last rows take
        # another path), and its sigmoid over whole [N, D] rows (the scalar tail of a vectorised [N, 1] loop rounds
        # differently): a row's numbers never depend on its place in the batch
        shared = self.shared_expert(x)  # [N, D]
        gate = (x.float() * self.shared_expert_gate.weight.float()).sum(-1, keepdim=True).to(x.dtype)  # [N, 1]
        return super().forward(x) + torch.sigmoid(gate.expand_as(shared).contiguous()) * shared


class Qwen35Layer(nn.Module):
    def __init__(self, cfg: TextConfig, q35: Qwen35Config, i: int) -> None:
        super().__init__()
        self.linear = q35.layer_types[i] == "linear_attention"
        if self.linear:
            self.linear_attn = GatedDeltaNet(GatedDeltaDims(
                cfg.hidden_size, q35.key_heads, q35.value_heads, q35.key_dim, q35.value_dim, q35.conv_kernel,
                cfg.rms_norm_eps, cfg.hidden_act, GDN_CHUNK))
        else:
            self.self_attn = GatedAttention(cfg, q35.rotary_dim, q35.attention_layers.index(i))
        self.mlp = (SharedExpertMoE(cfg.hidden_size, cfg, q35.shared_expert_intermediate, i) if cfg.moe is not None
                    else GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act))
        self.input_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen35TextModel(nn.Module):
    """Token embeddings, the hybrid layers and the final norm (HF `model.language_model.*`)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        assert config.qwen35 is not None
        cfg, q35 = config.text, config.qwen35
        self.cfg, self.q35 = cfg, q35
        self.embed_tokens = nn.Embedding.from_pretrained(torch.empty(cfg.vocab_size, cfg.hidden_size), freeze=False)
        self.layers = nn.ModuleList(Qwen35Layer(cfg, q35, i) for i in range(len(q35.layer_types)))
        self.norm = ZeroCenteredRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.inv_freq = rope_inv_freq(cfg.rope_theta, q35.rotary_dim)  # over the rotary dims only

    def state_shapes(self) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
        return {i: layer.linear_attn.state_shapes() for i, layer in enumerate(self.layers) if layer.linear}

    def state_pool(self, slots: int) -> StatePool:
        w = self.embed_tokens.weight
        return StatePool(self.state_shapes(), slots, w.dtype, w.device)

    def forward(self, inputs_embeds: Tensor, positions: Tensor, ctx: AttentionContext,
                deepstack: DeepStack | None = None) -> Tensor:
        """inputs_embeds [N, D], positions [3, N] -> final-normed hidden [N, D]; DeltaNet state through
        ctx.recurrent (a RecurrentBatch, advanced states staged for its commit)."""
        states: RecurrentBatch = ctx.recurrent  # type: ignore[attr-defined]
        cos, sin = mrope_cos_sin(positions, self.inv_freq, self.cfg.mrope_section, inputs_embeds.dtype,
                                 interleaved=True)  # [N, rotary_dim]
        x = inputs_embeds
        for i, layer in enumerate(self.layers):
            h = layer.input_layernorm(x)
            x = x + (states.run_layer(i, layer.linear_attn, h) if layer.linear else layer.self_attn(h, cos, sin, ctx))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)


def qwen35_target(name: str) -> tuple[str, int | None] | None:
    """The loader's mapping for Qwen3.5: the Qwen names (hf_target), the hub's MTP head skipped by name as
    transformers skips it (`^mtp.*`)."""
    return None if name.startswith("mtp.") else hf_target(name)
