"""Vision tower + merger equal transformers' get_image_features / get_video_features (float32)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from model_cases import CHECKPOINTS, TOL, build_prompt, max_diff

from mm_infer.models import load_model

CASES = {
    "one_image": [("image", 1, 8, 12)],
    "three_images": [("image", 1, 8, 12), ("image", 1, 4, 4), ("image", 1, 6, 10)],
    "video": [("video", 3, 8, 8)],
    "two_videos": [("video", 2, 6, 4), ("video", 1, 10, 14)],
}


@pytest.mark.parametrize("case", sorted(CASES))
@torch.no_grad()
def test_vision_embeddings_match_hf(kind, ours, hf_model, record, case):
    model, cfg = ours
    kind_of_media = CASES[case][0][0]
    prompt = build_prompt(cfg, CASES[case], seed=1)
    if kind_of_media == "image":
        pixels, grid = prompt.pixel_values, prompt.image_grid_thw
        ref = hf_model.model.get_image_features(pixels, grid).pooler_output
    else:
        pixels, grid = prompt.pixel_values_videos, prompt.video_grid_thw
        ref = hf_model.model.get_video_features(pixels, grid).pooler_output
    ref = torch.cat(list(ref), dim=0)
    got = model.encode_vision(pixels, grid)
    assert got.shape == (int(grid.prod(-1).sum()) // 4, cfg.text.hidden_size)
    assert record(f"{kind}/vision/{case}", max_diff(got, ref)) <= TOL


@torch.no_grad()
def test_items_do_not_attend_across(ours):
    """Encoding images together equals encoding each alone: attention is block-diagonal."""
    model, cfg = ours
    prompt = build_prompt(cfg, CASES["three_images"], seed=2)
    together = model.encode_vision(prompt.pixel_values, prompt.image_grid_thw)
    sizes = prompt.image_grid_thw.prod(-1).tolist()
    alone = [
        model.encode_vision(px, g[None])
        for px, g in zip(prompt.pixel_values.split(sizes), prompt.image_grid_thw, strict=True)
    ]
    assert max_diff(together, torch.cat(alone)) <= 1e-5


@torch.no_grad()
def test_qwen25_window_attention_is_not_full_attention():
    """With every block set to full attention the output must change: windows really restrict."""
    model, cfg = load_model(CHECKPOINTS["qwen2_5_vl"])
    prompt = build_prompt(cfg, [("image", 1, 8, 12)], seed=3)
    windowed = model.encode_vision(prompt.pixel_values, prompt.image_grid_thw)
    model.visual.cfg = replace(cfg.vision, fullatt_block_indexes=tuple(range(cfg.vision.depth)))
    full = model.encode_vision(prompt.pixel_values, prompt.image_grid_thw)
    assert max_diff(windowed, full) > 1e-3
