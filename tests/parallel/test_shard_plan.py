"""The tensor-parallel sharding plan without processes: what each rank loads is exactly its slice of the stored
tensors (q/k/v by heads, KV replicated past the KV heads, o and down by columns, experts inside, the LM head by
vocabulary rows), and models that cannot split are refused with the dimension named."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mm_infer.models.config import load_config
from mm_infer.models.loader import load_model
from mm_infer.parallel.group import RankGroup
from mm_infer.parallel.plan import TensorParallelError, check_splittable, local_config
from mm_infer.parallel.shard_spec import Piece, ShardSpec

MODELS = Path(__file__).resolve().parents[2] / "assets" / "models"


def _rank(rank: int, size: int) -> RankGroup:
    return RankGroup(rank, size, tensors=None, commands=None)  # loading only: no collective runs


def test_piece_and_fused_spec_cut_each_part_alone():
    whole = torch.arange(24).reshape(12, 2)  # q rows 0..7, k rows 8..9, v rows 10..11
    spec = ShardSpec((Piece(0, 1, 2), Piece(0, 1, 2), Piece(0, 1, 2)), sizes=(8, 2, 2))
    got = spec.take(whole, None)
    assert got[:, 0].tolist() == [8, 10, 12, 14, 18, 22]  # q rows 4..7, k row 9, v row 11
    assert spec.stored_shape((6, 2), None) == (12, 2)
    assert spec.take(whole[:8], 0)[:, 0].tolist() == [8, 10, 12, 14] and spec.stored_shape((1, 2), 1) == (2, 2)
    experts = ShardSpec((Piece(1, 0, 2),), lead=1)  # down_proj [E, H, I]: columns of I
    stacked = torch.arange(2 * 3 * 4).reshape(2, 3, 4)
    assert torch.equal(experts.take(stacked, None), stacked[:, :, :2])
    assert torch.equal(experts.take(stacked[1], 1), stacked[1, :, :2])
    with pytest.raises(ValueError, match="does not split into 3"):
        Piece(0, 0, 3).take(torch.zeros(4))


@pytest.mark.parametrize("name", ["tiny-nemotron-omni", "tiny-qwen3.5"])
def test_hybrid_models_are_refused_with_the_reason(name):
    with pytest.raises(TensorParallelError, match="hybrid"):
        check_splittable(load_config(MODELS / name), 2)


def test_dimensions_that_do_not_split_are_named():
    config = load_config(MODELS / "tiny-qwen2-vl")  # 4 heads, 2 KV heads, vocab 3008
    with pytest.raises(TensorParallelError, match="num_attention_heads = 4"):
        check_splittable(config, 3)
    odd_kv = replace(config, text=replace(config.text, num_heads=12, num_kv_heads=3, intermediate_size=264))
    with pytest.raises(TensorParallelError, match="num_key_value_heads = 3"):
        check_splittable(odd_kv, 4)
    local = local_config(config, 4)
    assert (local.text.num_heads, local.text.num_kv_heads, local.text.head_dim) == (1, 1, config.text.head_dim)


@pytest.mark.parametrize("name, size", [("tiny-qwen2-vl", 2), ("tiny-qwen2-vl", 4), ("tiny-qwen3-vl-moe", 2),
                                        ("tiny-qwen2.5-vl", 2)])
def test_each_rank_loads_exactly_its_slice(name, size):
    whole, config = load_model(MODELS / name)
    text = config.text
    d, kv = text.head_dim, text.num_kv_heads
    for rank in range(size):
        part, _ = load_model(MODELS / name, group=_rank(rank, size))
        w, p = whole.language.layers[0], part.language.layers[0]
        q_rows, inter = text.num_heads * d // size, text.intermediate_size // size
        kv_head = rank * min(size, kv) // size * (kv // min(size, kv))  # the first KV head this rank holds
        k_local = max(kv // size, 1) * d
        wq, wk, _ = w.self_attn.qkv_proj.weight.split([text.num_heads * d, kv * d, kv * d])
        pq, pk, _ = p.self_attn.qkv_proj.weight.split([q_rows, k_local, k_local])
        assert torch.equal(pq, wq[rank * q_rows:(rank + 1) * q_rows])
        assert torch.equal(pk, wk[kv_head * d:kv_head * d + k_local])
        assert torch.equal(p.self_attn.o_proj.weight, w.self_attn.o_proj.weight[:, rank * q_rows:(rank + 1) * q_rows])
        if text.moe is not None and hasattr(w.mlp, "experts"):
            i = text.moe.intermediate_size // size
            gate, up = w.mlp.experts.gate_up_proj.chunk(2, dim=1)
            assert torch.equal(p.mlp.experts.gate_up_proj, torch.cat([gate[:, rank * i:(rank + 1) * i],
                                                                      up[:, rank * i:(rank + 1) * i]], dim=1))
            assert torch.equal(p.mlp.experts.down_proj, w.mlp.experts.down_proj[:, :, rank * i:(rank + 1) * i])
            assert torch.equal(p.mlp.gate.weight, w.mlp.gate.weight)  # the router stays whole
        else:
            gate, up = w.mlp.gate_up_proj.weight.chunk(2)
            assert torch.equal(p.mlp.gate_up_proj.weight, torch.cat([gate[rank * inter:(rank + 1) * inter],
                                                                     up[rank * inter:(rank + 1) * inter]]))
            assert torch.equal(p.mlp.down_proj.weight, w.mlp.down_proj.weight[:, rank * inter:(rank + 1) * inter])
        tower = whole.visual.state_dict()
        assert all(torch.equal(t, tower[k]) for k, t in part.visual.state_dict().items())  # replicated whole
        rows = text.vocab_size // size
        if whole.lm_head is not None:
            assert torch.equal(part.lm_head.weight, whole.lm_head.weight[rank * rows:(rank + 1) * rows])
        else:
            assert part.lm_head is None  # tied: each rank scores the rows of its replicated embedding
