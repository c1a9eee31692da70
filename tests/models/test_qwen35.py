"""Qwen3.5 (dense and MoE: gated DeltaNet + gated full attention, Qwen3-VL's tower without DeepStack) against
transformers in float32: vision, full-prompt logits, greedy generate; the ablations that must move the logits."""

from __future__ import annotations

import pytest
import torch
from model_cases import TOL, hf_inputs, max_diff
from qwen3_cases import PROMPTS, QWEN35, build_prompt, greedy_diff, hf, our_logits, ours


@pytest.fixture(params=sorted(QWEN35))
def kind(request) -> str:
    return request.param


def test_checkpoint_loads_in_transformers_without_missing_or_unexpected_keys(kind):
    from transformers import AutoModelForImageTextToText

    _, info = AutoModelForImageTextToText.from_pretrained(QWEN35[kind], output_loading_info=True)
    assert not any(info.values()), info
    model, cfg = ours(kind)
    assert cfg.qwen35.layer_types.count("linear_attention") >= 2 and cfg.text.num_layers >= 1
    assert kind == "qwen3_5" or (cfg.text.moe.num_experts >= 8 and cfg.text.moe.top_k == 2)


@pytest.mark.parametrize("case", [[("image", 1, 8, 12), ("image", 1, 4, 4)], [("video", 3, 8, 8)]],
                         ids=["two_images", "video"])
@torch.no_grad()
def test_vision_matches_hf(kind, record, case):
    model, cfg = ours(kind)
    prompt = build_prompt(cfg, case, seed=1)
    video = case[0][0] == "video"
    pixels, grid = ((prompt.pixel_values_videos, prompt.video_grid_thw) if video
                    else (prompt.pixel_values, prompt.image_grid_thw))
    ref = hf(kind).model.visual(pixels, grid_thw=grid, return_dict=True).pooler_output
    main, deep = model.split_vision(model.encode_vision(pixels, grid))
    assert deep is None
    assert record(f"{kind}/vision/{'video' if video else 'images'}", max_diff(main, ref)) <= TOL


@pytest.mark.parametrize("name", sorted(PROMPTS))
@torch.no_grad()
def test_full_prompt_logits_match_hf(kind, record, name):
    # catches: any part of the hybrid stack (DeltaNet, output gate, partial rotary, 1 + w norms, shared expert)
    model, cfg = ours(kind)
    prompt = build_prompt(cfg, PROMPTS[name])
    ref = hf(kind)(**hf_inputs(cfg, prompt)).logits[0]
    got = our_logits(model, cfg, prompt)
    assert record(f"{kind}/logits/{name}", max_diff(got, ref)) <= TOL


@pytest.mark.parametrize("name", ["text_only", "two_images", "image_and_video", "long_video"])
def test_greedy_generate_matches_hf(kind, record, name):
    _, cfg = ours(kind)
    assert record(f"{kind}/generate/{name}", greedy_diff(kind, build_prompt(cfg, PROMPTS[name], seed=5))) <= TOL


@pytest.mark.parametrize("ablation", ["plain norm weight", "gate not interleaved", "full rotary", "no shared gate"])
@torch.no_grad()
def test_ablations_move_the_logits(ablation, monkeypatch):
    # the bugs the parity tests above catch, each moving the logits far past TOL
    from mm_infer.models import qwen35

    kind = "qwen3_5_moe"
    model, cfg = ours(kind)
    prompt = build_prompt(cfg, PROMPTS["one_image"])
    ref = hf(kind)(**hf_inputs(cfg, prompt)).logits[0]
    if ablation == "plain norm weight":
        monkeypatch.setattr(qwen35.ZeroCenteredRMSNorm, "forward", lambda self, x: (
            x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(x.dtype))
    elif ablation == "gate not interleaved":
        real = qwen35.GatedAttention.forward

        def swapped(self, x, cos, sin, ctx):
            w = self.qkv_proj.weight
            q = self.heads * self.head_dim
            blocks = w[:2 * q].view(self.heads, 2, self.head_dim, -1).transpose(0, 1).reshape(2 * q, -1)
            saved = w[:2 * q].clone()
            w[:2 * q] = blocks
            try:
                return real(self, x, cos, sin, ctx)
            finally:
                w[:2 * q] = saved
        monkeypatch.setattr(qwen35.GatedAttention, "forward", swapped)
    elif ablation == "full rotary":
        def whole_head(self, x, cos, sin):  # every dim rotated instead of the first rotary_dim
            reps = x.shape[-1] // cos.shape[-1]
            return qwen35.apply_rotary(x, cos.repeat(1, reps), sin.repeat(1, reps))
        monkeypatch.setattr(qwen35.GatedAttention, "_rotate", whole_head)
    else:
        monkeypatch.setattr(qwen35.SharedExpertMoE, "forward", lambda self, x: qwen35.SparseMoE.forward(self, x)
                            + self.shared_expert(x))
    assert max_diff(our_logits(model, cfg, prompt), ref) > 100 * TOL
