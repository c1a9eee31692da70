"""Qwen3-VL-MoE: router and grouped experts against HF's sparse block; both fused-expert layouts load and refit."""

from __future__ import annotations

import pytest
import torch
from model_cases import max_diff
from qwen3_cases import PROMPTS, QWEN3, build_prompt, hf, our_logits, ours

import mm_infer.models.moe as moe
from mm_infer.models import load_model, load_state_dict_into
from mm_infer.models.half_gemm_path import forced_path
from mm_infer.models.layers import GatedMLP
from mm_infer.models.loader import iter_safetensors
from mm_infer.rl.weights import plan_refit

KIND = "qwen3_vl_moe"


def _hidden(tokens: int, seed: int = 0) -> torch.Tensor:
    return 2.0 * torch.randn(tokens, ours(KIND)[1].text.hidden_size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("layer", [0, 2])
@torch.no_grad()
def test_sparse_block_matches_hf_on_a_batch_spread_over_experts(record, layer):
    model, cfg = ours(KIND)
    block, ref_block = model.language.layers[layer].mlp, hf(KIND).model.language_model.layers[layer].mlp
    x = _hidden(96, seed=layer)
    weights, experts = block.route(x)
    _, ref_weights, ref_experts = ref_block.gate(x)
    assert torch.equal(experts, ref_experts) and max_diff(weights, ref_weights) <= 1e-6
    assert torch.allclose(weights.sum(-1), torch.ones(96)) and experts.shape == (96, cfg.text.moe.top_k)
    assert len(experts.unique()) >= 6, "the batch must exercise most of the 8 experts"
    got, want = block(x), ref_block(x[None])[0]
    assert record(f"{KIND}/moe_block/layer{layer}", max_diff(got, want)) <= 1e-5


@torch.no_grad()
def test_dense_layers_follow_mlp_only_layers():
    model, cfg = ours(KIND)
    kinds = [type(layer.mlp) for layer in model.language.layers]
    assert kinds == [moe.SparseMoE, GatedMLP, moe.SparseMoE] and cfg.text.moe.mlp_only_layers == (1,)


@torch.no_grad()
def test_grouped_gemm_and_per_expert_fallback_agree(monkeypatch):
    block = ours(KIND)[0].language.layers[0].mlp
    x = _hidden(40, seed=7)
    grouped = block(x)
    monkeypatch.setattr(moe, "_grouped_mm_ok", lambda x, w: False)
    assert max_diff(block(x), grouped) <= 1e-6


@torch.no_grad()
@pytest.mark.parametrize("path", ["tiles", "torch"])
def test_half_experts_on_cpu_follow_the_half_gemm_path(monkeypatch, path):
    # catches: bf16 experts left on torch's grouped GEMM on a CPU without native bf16 (one weight pass per row), kept
    # off it on a CPU with native bf16 (4x slower there), or float32 moved off it
    calls = []
    real = moe.F.grouped_mm
    monkeypatch.setattr(moe.F, "grouped_mm", lambda *a, **k: calls.append(a[0].dtype) or real(*a, **k))
    w = torch.randn(4, 32, 16)
    x, counts = torch.randn(40, 16), torch.tensor([10, 0, 20, 10])
    with forced_path(path):
        moe.grouped_linear(x, w, counts)
        assert calls == [torch.float32]
        got = moe.grouped_linear(x.bfloat16(), w.bfloat16(), counts)
        parts = x.bfloat16().split(counts.tolist())
        want = torch.cat([moe.linear(part, w[e].bfloat16()) for e, part in enumerate(parts)])
    if path == "tiles":
        assert calls == [torch.float32]
        assert torch.equal(got, want)
    else:
        assert calls == [torch.float32, torch.bfloat16]
        torch.testing.assert_close(got, want)  # the grouped GEMM sums in its own order


def test_one_row_per_expert_takes_each_experts_mv(monkeypatch):
    # catches: decode-sized MoE batches (about a row per expert) left on the grouped GEMM where mv is faster
    monkeypatch.setattr(moe, "mv_for_single_rows", lambda dtype: dtype == torch.bfloat16)
    calls = []
    real = moe.F.grouped_mm
    monkeypatch.setattr(moe.F, "grouped_mm", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    w = torch.randn(4, 32, 16).bfloat16()
    with forced_path("torch"):
        few = moe.grouped_linear(torch.randn(4, 16).bfloat16(), w, torch.tensor([1, 1, 0, 2]))
        moe.grouped_linear(torch.randn(40, 16).bfloat16(), w, torch.tensor([10, 0, 20, 10]))
    assert few.shape == (4, 32) and calls == [40]


@torch.no_grad()
def test_transformers_saved_layout_loads_and_refits(tmp_path):
    """transformers 5 saves fused experts as [E, 2I, H]; the hub stores [E, H, 2I]. Both load to the same model."""
    saved = tmp_path / "saved"
    hf(KIND).save_pretrained(saved)
    shapes = {name: tuple(t.shape) for name, t in iter_safetensors(saved) if name.endswith("experts.gate_up_proj")}
    hub = {name: tuple(t.shape) for name, t in iter_safetensors(QWEN3[KIND]) if name.endswith("experts.gate_up_proj")}
    assert shapes and all(shapes[n] == (s[0], s[2], s[1]) for n, s in hub.items())
    model, cfg = ours(KIND)
    again, _ = load_model(saved)
    for (name, a), (_, b) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    for source in (saved, QWEN3[KIND]):  # refit planning by HF name accepts both files' shapes
        assert len(plan_refit(source, again)) == len(list(iter_safetensors(source)))
    with torch.no_grad():
        for p in again.parameters():
            p.zero_()
    filled = load_state_dict_into(again, dict(hf(KIND).named_parameters()), strict=True)  # a trainer's live names
    assert filled == {n for n, _ in again.named_parameters()}
    prompt = build_prompt(cfg, PROMPTS["image_and_video"])
    assert max_diff(our_logits(again, cfg, prompt), our_logits(model, cfg, prompt)) == 0.0
