"""PagedAttentionContext: the engine's AttentionContext, writing K/V into paged blocks, attending per sequence."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mm_infer.models.attention import causal_attention


@dataclass
class KVCache:
    """Per-layer key/value slots: [layers, num_blocks * block_size, Hkv, d]."""

    k: Tensor
    v: Tensor
    block_size: int

    @staticmethod
    def allocate(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> KVCache:
        shape = (num_layers, num_blocks * block_size, num_kv_heads, head_dim)
        return KVCache(torch.zeros(shape, dtype=dtype, device=device),
                       torch.zeros(shape, dtype=dtype, device=device), block_size)


@dataclass
class SeqSpan:
    """One sequence's queries in the flat batch and the cache slots of its whole context."""

    q_start: int
    q_len: int
    ctx_slots: Tensor  # [ctx_len] long, the last q_len of which are this step's tokens


class PagedAttentionContext:
    """Writes this step's K/V to their slots (all sequences first), then runs causal attention per sequence.

    Writing first lets a sequence read prefix blocks that another sequence fills in the same step. Rows
    past the real tokens (padding for row-invariant matmuls) get zeros and write nothing.
    """

    def __init__(self, cache: KVCache, slot_mapping: Tensor, spans: list[SeqSpan]) -> None:
        self.cache = cache
        self.slot_mapping = slot_mapping  # [N_real] long
        self.spans = spans

    def attend(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        n = self.slot_mapping.shape[0]
        k_layer, v_layer = self.cache.k[layer_idx], self.cache.v[layer_idx]  # [S, Hkv, d]
        k_layer.index_copy_(0, self.slot_mapping, k[:n])
        v_layer.index_copy_(0, self.slot_mapping, v[:n])
        out = torch.zeros_like(q)  # [N, Hq, d]
        for span in self.spans:
            ks = k_layer.index_select(0, span.ctx_slots)  # [ctx, Hkv, d]
            vs = v_layer.index_select(0, span.ctx_slots)
            out[span.q_start:span.q_start + span.q_len] = causal_attention(
                q[span.q_start:span.q_start + span.q_len], ks, vs)
        return out
