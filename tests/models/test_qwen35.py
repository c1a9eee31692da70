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


@pytest.mark.parametrize("ablation", ["plain norm weight", "gate not interleaved", "no output gate", "full rotary",
                                      "M-RoPE not interleaved", "no shared gate", "chunk decay dropped"])
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
    elif ablation == "no output gate":
        def ungated(self, x, cos, sin, ctx):
            n = x.shape[0]
            qg, k, v = self.qkv_proj.forward_parts(x)
            q = qg.reshape(n, self.heads, 2 * self.head_dim)[..., :self.head_dim]
            k, v = k.reshape(n, self.kv_heads, self.head_dim), v.reshape(n, self.kv_heads, self.head_dim)
            q, k = self._rotate(self.q_norm(q), cos, sin), self._rotate(self.k_norm(k), cos, sin)
            return self.o_proj(ctx.attend(self.kv_index, q, k, v).reshape(n, -1))
        monkeypatch.setattr(qwen35.GatedAttention, "forward", ungated)
    elif ablation == "M-RoPE not interleaved":
        real_cos_sin = qwen35.mrope_cos_sin
        monkeypatch.setattr(qwen35, "mrope_cos_sin", lambda *a, interleaved=True: real_cos_sin(*a, interleaved=False))
    elif ablation == "chunk decay dropped":
        from mm_infer.models import gated_delta

        real_rule = gated_delta.chunked_gated_delta
        monkeypatch.setattr(gated_delta, "chunked_gated_delta",
                            lambda q, k, v, g, beta, state, chunk: real_rule(q, k, v, g * 0, beta, state, chunk))
    else:
        monkeypatch.setattr(qwen35.SharedExpertMoE, "forward", lambda self, x: qwen35.SparseMoE.forward(self, x)
                            + self.shared_expert(x))
    assert max_diff(our_logits(model, cfg, prompt), ref) > 100 * TOL


@torch.no_grad()
def test_the_delta_rules_chunk_size_is_only_rounding():
    # a different chunk size is the same rule (HF's 64 and a short prompt's 8 agree to fp32 rounding): the chunk
    # grid matters for bit-exact batch invariance (the scheduler's scan grid), never for the values
    from mm_infer.models.gated_delta import chunked_gated_delta, l2norm

    g = torch.Generator().manual_seed(4)
    q, k = l2norm(torch.randn(150, 4, 16, generator=g)) * 0.25, l2norm(torch.randn(150, 4, 16, generator=g))
    v = torch.randn(150, 4, 16, generator=g)
    gate, beta = -torch.rand(150, 4, generator=g), torch.rand(150, 4, generator=g)
    start = torch.zeros(4, 16, 16)
    a, sa = chunked_gated_delta(q, k, v, gate, beta, start, 64)
    b, sb = chunked_gated_delta(q, k, v, gate, beta, start, 8)
    assert (a - b).abs().max().item() <= 1e-5 and (sa - sb).abs().max().item() <= 1e-5
