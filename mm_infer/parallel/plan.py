"""The Megatron-style sharding of a Qwen-VL model over tensor-parallel ranks: which layers split how, checked
before anything is built, and applied to the model while it still lives on the meta device."""

from __future__ import annotations

from dataclasses import replace

from torch import nn

from mm_infer.models.config import ModelConfig
from mm_infer.models.language import DecoderLayer, SelfAttention
from mm_infer.models.layers import GatedMLP
from mm_infer.models.moe import SparseMoE
from mm_infer.parallel.group import RankGroup
from mm_infer.parallel.layers import RowParallelLinear, VocabParallelLogits, reduce_output
from mm_infer.parallel.shard_spec import Piece, ShardSpec


class TensorParallelError(ValueError):
    """A model this tensor-parallel size cannot split exactly (the reason names the dimension)."""


def check_splittable(config: ModelConfig, size: int) -> None:
    """Refuse, naming the reason, a model that `size` ranks cannot shard."""
    if config.omni is not None or config.qwen35 is not None:
        raise TensorParallelError(f"tensor parallelism is not built for hybrid (Mamba-2 / gated DeltaNet) models "
                                  f"yet: {config.kind} runs at --tensor-parallel-size 1")
    text = config.text
    dims = {"num_attention_heads": text.num_heads, "intermediate_size": text.intermediate_size,
            "vocab_size": text.vocab_size}
    if text.moe is not None:
        dims["moe_intermediate_size"] = text.moe.intermediate_size
    for name, value in dims.items():
        if value % size:
            raise TensorParallelError(f"{name} = {value} does not split over {size} tensor-parallel ranks")
    kv = text.num_kv_heads
    if (kv % size) if kv >= size else (size % kv):
        raise TensorParallelError(f"num_key_value_heads = {kv} neither splits over {size} tensor-parallel ranks "
                                  f"nor replicates evenly onto them")


def local_config(config: ModelConfig, size: int) -> ModelConfig:
    """The shapes one rank builds: heads, MLP and expert widths divided by `size`; KV heads divided, or one per rank
    (replicated) when there are fewer KV heads than ranks. Vision and vocabulary stay whole."""
    check_splittable(config, size)
    text = config.text
    moe = text.moe if text.moe is None else replace(text.moe, intermediate_size=text.moe.intermediate_size // size)
    return replace(config, text=replace(text, num_heads=text.num_heads // size,
                                        num_kv_heads=max(text.num_kv_heads // size, 1),
                                        intermediate_size=text.intermediate_size // size, moe=moe,
                                        head_dim_override=text.head_dim))


def shard_model(model: nn.Module, whole: ModelConfig, group: RankGroup) -> None:
    """Give a (meta) model built from local_config its row-parallel layers, reductions, shard specs and
    vocab-parallel logits. Column-parallel layers need no new code: they are built narrower."""
    for layer in model.language.layers:
        assert isinstance(layer, DecoderLayer)
        _shard_attention(layer.self_attn, whole, group)
        if isinstance(layer.mlp, SparseMoE):
            _shard_experts(layer.mlp, group)
        else:
            _shard_mlp(layer.mlp, group)
    if model.lm_head is not None:
        model.lm_head.tp_shards = {"weight": ShardSpec((Piece(0, group.rank, group.size),))}
        model.lm_head.weight = nn.Parameter(model.lm_head.weight[:whole.text.vocab_size // group.size])
    model.vocab_parallel = VocabParallelLogits(group, whole.text.vocab_size)


def _shard_attention(attn: SelfAttention, whole: ModelConfig, group: RankGroup) -> None:
    """q heads split; KV heads split, or one replicated onto each group of size / kv ranks; o row-parallel."""
    text = whole.text
    kv_count = min(group.size, text.num_kv_heads)
    q = Piece(0, group.rank, group.size)
    kv = Piece(0, group.rank * kv_count // group.size, kv_count)
    d = text.head_dim
    spec = ShardSpec((q, kv, kv), sizes=(text.num_heads * d, text.num_kv_heads * d, text.num_kv_heads * d))
    attn.qkv_proj.tp_shards = {"weight": spec, "bias": spec}
    old = attn.o_proj
    attn.o_proj = RowParallelLinear(old.in_features, old.out_features, old.bias is not None, group)
    attn.o_proj.tp_shards = {"weight": ShardSpec((Piece(1, group.rank, group.size),))}


def _shard_mlp(mlp: GatedMLP, group: RankGroup) -> None:
    rows = Piece(0, group.rank, group.size)
    spec = ShardSpec((rows, rows), sizes=(mlp.down_proj.in_features * group.size,) * 2)
    mlp.gate_up_proj.tp_shards = {"weight": spec, "bias": spec}
    old = mlp.down_proj
    mlp.down_proj = RowParallelLinear(old.in_features, old.out_features, old.bias is not None, group)
    mlp.down_proj.tp_shards = {"weight": ShardSpec((Piece(1, group.rank, group.size),))}


def _shard_experts(moe: SparseMoE, group: RankGroup) -> None:
    """TP inside each expert: gate/up rows and down columns split; the router stays whole; the block's output (a
    partial sum) is all-reduced."""
    rows = Piece(0, group.rank, group.size)
    width = moe.experts.down_proj.shape[-1] * group.size  # the whole intermediate size
    moe.experts.tp_shards = {"gate_up_proj": ShardSpec((rows, rows), sizes=(width, width), lead=1),
                             "down_proj": ShardSpec((Piece(1, group.rank, group.size),), lead=1)}
    moe.register_forward_hook(reduce_output(group))
