"""Qwen2 / Qwen3 decoder stack over flat token batches: GQA attention with M-RoPE, SwiGLU or MoE MLP, RMSNorm."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mm_infer.models.attention import AttentionContext
from mm_infer.models.config import TextConfig
from mm_infer.models.half_linear import Linear
from mm_infer.models.layers import FusedLinear, GatedMLP, RMSNorm, apply_rotary, mrope_cos_sin, rope_inv_freq
from mm_infer.models.moe import SparseMoE


@dataclass(frozen=True)
class DeepStack:
    """Qwen3-VL DeepStack: after LM layer i < L, embeds[i] is added to the hidden states of the visual rows."""

    rows: Tensor  # [K] long, batch rows holding image/video tokens
    embeds: Tensor  # [L, K, D]


class SelfAttention(nn.Module):
    def __init__(self, cfg: TextConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = FusedLinear(cfg.hidden_size, (q, kv, kv), bias=cfg.attention_bias)  # HF's q/k/v_proj
        self.o_proj = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        qk = cfg.qk_norm  # Qwen3: per-head RMSNorm of q and k
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if qk else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if qk else None

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, ctx: AttentionContext) -> Tensor:  # [N, D]
        n = x.shape[0]
        q, k, v = self.qkv_proj.forward_parts(x)
        q = q.reshape(n, self.num_heads, self.head_dim)  # [N, Hq, d]
        k = k.reshape(n, self.num_kv_heads, self.head_dim)  # [N, Hkv, d]
        v = v.reshape(n, self.num_kv_heads, self.head_dim)  # [N, Hkv, d]
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = ctx.attend(self.layer_idx, q, k, v)  # [N, Hq, d]
        return self.o_proj(out.reshape(n, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TextConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = SelfAttention(cfg, layer_idx)
        sparse = cfg.moe is not None and cfg.moe.is_sparse(layer_idx)
        self.mlp = (SparseMoE(cfg.hidden_size, cfg.moe, cfg.hidden_act, layer_idx) if sparse  # type: ignore[arg-type]
                    else GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act))
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, ctx: AttentionContext) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx)
        return x + self.mlp(self.post_attention_layernorm(x))


class TextModel(nn.Module):
    """Token embeddings, decoder layers and final norm (HF `model.language_model.*`)."""

    def __init__(self, cfg: TextConfig) -> None:
        super().__init__()
        self.cfg = cfg
        # from_pretrained skips the random init (always overwritten by the loader; slow on the meta device)
        self.embed_tokens = nn.Embedding.from_pretrained(torch.empty(cfg.vocab_size, cfg.hidden_size), freeze=False)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.inv_freq = rope_inv_freq(cfg.rope_theta, cfg.head_dim)  # float32, deliberately not a buffer
        self._inv_freq_on: dict[torch.device, Tensor] = {}  # copies per device: no host copy inside a CUDA graph

    def forward(self, inputs_embeds: Tensor, positions: Tensor, ctx: AttentionContext,
                deepstack: DeepStack | None = None) -> Tensor:
        """inputs_embeds [N, D], positions [3, N] -> final-normed hidden [N, D]."""
        if positions.dim() != 2 or positions.shape != (3, inputs_embeds.shape[0]):
            n = inputs_embeds.shape[0]
            raise ValueError(f"positions must be [3, {n}], got {tuple(positions.shape)}")
        inv_freq = self._inv_freq_on.get(positions.device)
        if inv_freq is None:
            inv_freq = self._inv_freq_on[positions.device] = self.inv_freq.to(positions.device)
        cos, sin = mrope_cos_sin(positions, inv_freq, self.cfg.mrope_section, inputs_embeds.dtype,
                                 self.cfg.mrope_interleaved)  # [N, d]
        x = inputs_embeds
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, ctx)
            if deepstack is not None and i < deepstack.embeds.shape[0]:
                x = x.index_add(0, deepstack.rows, deepstack.embeds[i].to(x.dtype))  # [N, D]
        return self.norm(x)
