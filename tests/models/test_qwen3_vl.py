"""Qwen3-VL (dense and MoE) against transformers in float32: vision + DeepStack, logits, greedy generate."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from model_cases import TOL, max_diff
from qwen3_cases import PROMPTS, QWEN3, build_prompt, greedy_diff, hf, hf_logits, our_logits, ours, positions

from mm_infer.models import DenseAttentionContext

VISION = {
    "one_image": [("image", 1, 8, 12)],
    "three_images": [("image", 1, 8, 12), ("image", 1, 4, 4), ("image", 1, 6, 10)],
    "video": [("video", 3, 8, 8)],
    "two_videos": [("video", 2, 6, 4), ("video", 1, 10, 14)],
}


@pytest.fixture(params=sorted(QWEN3))
def kind(request) -> str:
    return request.param


@pytest.mark.parametrize("case", sorted(VISION))
@torch.no_grad()
def test_vision_and_deepstack_match_hf(kind, record, case):
    model, cfg = ours(kind)
    prompt = build_prompt(cfg, VISION[case], seed=1)
    video = VISION[case][0][0] == "video"
    pixels, grid = ((prompt.pixel_values_videos, prompt.video_grid_thw) if video
                    else (prompt.pixel_values, prompt.image_grid_thw))
    ref = hf(kind).model.visual(pixels, grid_thw=grid, return_dict=True)
    main, deep = model.split_vision(model.encode_vision(pixels, grid))
    assert main.shape == (int(grid.prod(-1).sum()) // 4, cfg.text.hidden_size)
    assert deep is not None and deep.shape[0] == len(cfg.vision.deepstack_visual_indexes) == 2
    assert record(f"{kind}/vision/{case}", max_diff(main, ref.pooler_output)) <= TOL
    for i, feature in enumerate(ref.deepstack_features):
        assert record(f"{kind}/deepstack/{case}", max_diff(deep[i], feature)) <= TOL


@pytest.mark.parametrize("name", sorted(PROMPTS))
@torch.no_grad()
def test_full_prompt_logits_match_hf(kind, record, name):
    model, cfg = ours(kind)
    prompt = build_prompt(cfg, PROMPTS[name])
    ref = hf_logits(kind, cfg, prompt)
    got = our_logits(model, cfg, prompt)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert record(f"{kind}/logits/{name}", max_diff(got, ref)) <= TOL


@pytest.mark.parametrize("name", ["text_only", "two_images", "image_and_video", "long_video"])
def test_greedy_generate_matches_hf(kind, record, name):
    """HF generate (KV cache, rope delta) vs our forward over prompt + generated ids with decode_positions."""
    _, cfg = ours(kind)
    assert record(f"{kind}/generate/{name}", greedy_diff(kind, build_prompt(cfg, PROMPTS[name], seed=5))) <= TOL


@torch.no_grad()
def test_packed_sequences_with_deepstack_equal_each_alone(kind, record):
    """Three prompts through embed_media + one DenseAttentionContext: DeepStack rows land in the right sequence."""
    model, cfg = ours(kind)
    prompts = [build_prompt(cfg, PROMPTS[n], seed=i) for i, n in enumerate(["one_image", "text_only", "video"])]
    embeds, pos, rows, vision, offset = [], [], [], [], 0
    for p in prompts:
        embeds.append(model.embed_tokens(p.input_ids))
        pos.append(positions(cfg, p)[0])
        for px, grid, tok in ((p.pixel_values, p.image_grid_thw, cfg.image_token_id),
                              (p.pixel_values_videos, p.video_grid_thw, cfg.video_token_id)):
            if px is not None:
                rows.append((p.input_ids == tok).nonzero()[:, 0] + offset)
                vision.append(model.encode_vision(px, grid))
        offset += p.input_ids.numel()
    merged, deepstack = model.embed_media(torch.cat(embeds), torch.cat(rows), torch.cat(vision))
    ctx = DenseAttentionContext([p.input_ids.numel() for p in prompts])
    packed = model.compute_logits(model.forward_hidden(merged, torch.cat(pos, dim=1), ctx, deepstack))
    for got, p in zip(packed.split(ctx.seq_lens), prompts, strict=True):
        assert record(f"{kind}/packed_vs_alone", max_diff(got, our_logits(model, cfg, p))) <= 1e-5


def _nearest_taps(size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest-row lookup instead of HF's bilinear align_corners resampling."""
    taps = (torch.arange(size) * side // size)[:, None].repeat(1, 2)
    return taps, torch.tensor([[1.0, 0.0]]).repeat(size, 1)


@torch.no_grad()
def test_ablations_move_logits_beyond_tolerance(monkeypatch):
    """The parity checks can fail: without DeepStack, the bilinear position resampling or interleaved M-RoPE,
    logits move far past TOL."""
    import mm_infer.models.vision_qwen3 as vq

    model, cfg = ours("qwen3_vl")
    prompt = build_prompt(cfg, PROMPTS["image_and_video"], seed=3)
    ref = hf_logits("qwen3_vl", cfg, prompt)
    assert max_diff(our_logits(model, cfg, prompt), ref) <= TOL
    with monkeypatch.context() as m:
        m.setattr(model, "split_vision", lambda v: (v[:, :cfg.text.hidden_size], None))  # DeepStack dropped
        assert max_diff(our_logits(model, cfg, prompt), ref) > 100 * TOL
    with monkeypatch.context() as m:
        m.setattr(vq, "_axis_taps", _nearest_taps)
        assert max_diff(our_logits(model, cfg, prompt), ref) > 100 * TOL
    with monkeypatch.context() as m:
        m.setattr(model.language, "cfg", replace(cfg.text, mrope_interleaved=False))
        assert max_diff(our_logits(model, cfg, prompt), ref) > 100 * TOL
