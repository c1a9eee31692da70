"""Shared builders for model tests: checkpoints, synthetic multimodal prompts, HF reference calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

REPO = Path(__file__).resolve().parents[2]
CHECKPOINTS = {
    "qwen2_vl": REPO / "assets" / "models" / "tiny-qwen2-vl",
    "qwen2_5_vl": REPO / "assets" / "models" / "tiny-qwen2.5-vl",
}
TOL = 1e-4
TEXT_VOCAB = 3000  # ids below this are plain BPE tokens in the tiny tokenizers
# Prompt layouts shared by the Qwen2 and Qwen3 parity tests: ints are random text tokens, tuples media grids (t, h, w)
PROMPTS = {
    "text_only": [23],
    "one_image": [5, ("image", 1, 8, 12), 7],
    "two_images": [4, ("image", 1, 4, 8), 3, ("image", 1, 6, 6), 5],
    "video": [6, ("video", 3, 8, 8), 4],
    "image_and_video": [3, ("image", 1, 8, 12), 2, ("video", 2, 4, 8), 5],
    "long_video": [2, ("video", 6, 4, 4), 3],  # t > h/merge: checks where text resumes after a video
}


@dataclass
class Prompt:
    """One flat sequence with its media, in the layout the processor would produce."""

    input_ids: Tensor  # [N]
    image_grids: list[list[int]] = field(default_factory=list)
    video_grids: list[list[int]] = field(default_factory=list)
    pixel_values: Tensor | None = None  # [P_img, 1176]
    pixel_values_videos: Tensor | None = None  # [P_vid, 1176]
    second_per_grid_ts: list[float] | None = None

    @property
    def image_grid_thw(self) -> Tensor | None:
        return torch.tensor(self.image_grids) if self.image_grids else None

    @property
    def video_grid_thw(self) -> Tensor | None:
        return torch.tensor(self.video_grids) if self.video_grids else None


def build_prompt(cfg, parts: list, seed: int = 0, seconds: list[float] | None = None) -> Prompt:
    """parts: ints (that many random text tokens), ("image", t, h, w) or ("video", t, h, w)."""
    gen = torch.Generator().manual_seed(seed)
    ids: list[Tensor] = []
    grids: dict[str, list[list[int]]] = {"image": [], "video": []}
    for part in parts:
        if isinstance(part, int):
            ids.append(torch.randint(0, TEXT_VOCAB, (part,), generator=gen))
            continue
        kind, t, h, w = part
        grids[kind].append([t, h, w])
        pad = cfg.image_token_id if kind == "image" else cfg.video_token_id
        n = t * h * w // cfg.vision.spatial_merge_size**2
        ids.append(torch.tensor([cfg.vision_start_token_id] + [pad] * n + [cfg.vision_end_token_id]))

    def pixels(kind: str) -> Tensor | None:
        if not grids[kind]:
            return None
        n = sum(t * h * w for t, h, w in grids[kind])
        return torch.randn(n, cfg.vision.patch_dim, generator=gen)

    return Prompt(
        torch.cat(ids), grids["image"], grids["video"], pixels("image"), pixels("video"),
        seconds if seconds is not None or not grids["video"] else None,
    )


def mm_token_type_ids(cfg, input_ids: Tensor) -> Tensor:
    """What the HF processor returns: 0 text, 1 image pad, 2 video pad."""
    types = torch.zeros_like(input_ids)
    types[input_ids == cfg.image_token_id] = 1
    types[input_ids == cfg.video_token_id] = 2
    return types


def hf_inputs(cfg, prompt: Prompt) -> dict:
    """Keyword arguments for an HF forward/generate call on a batch of one."""
    kw = dict(
        input_ids=prompt.input_ids[None],
        attention_mask=torch.ones_like(prompt.input_ids)[None],
        mm_token_type_ids=mm_token_type_ids(cfg, prompt.input_ids)[None],
    )
    if prompt.pixel_values is not None:
        kw |= dict(pixel_values=prompt.pixel_values, image_grid_thw=prompt.image_grid_thw)
    if prompt.pixel_values_videos is not None:
        kw |= dict(pixel_values_videos=prompt.pixel_values_videos, video_grid_thw=prompt.video_grid_thw)
        if cfg.kind == "qwen2_5_vl" and prompt.second_per_grid_ts is not None:
            kw["second_per_grid_ts"] = torch.tensor(prompt.second_per_grid_ts)
    return kw


def our_positions(cfg, prompt: Prompt) -> tuple[Tensor, int]:
    from mm_infer.prompt.mrope import get_mrope_positions

    return get_mrope_positions(
        prompt.input_ids, prompt.image_grid_thw, prompt.video_grid_thw,
        image_token_id=cfg.image_token_id, video_token_id=cfg.video_token_id,
        vision_start_token_id=cfg.vision_start_token_id, spatial_merge_size=cfg.vision.spatial_merge_size,
        tokens_per_second=cfg.vision.tokens_per_second, second_per_grid_ts=prompt.second_per_grid_ts,
    )


def our_logits(model, cfg, prompt: Prompt) -> Tensor:
    positions, _ = our_positions(cfg, prompt)
    return model(
        prompt.input_ids, positions, prompt.pixel_values, prompt.image_grid_thw,
        prompt.pixel_values_videos, prompt.video_grid_thw,
    )


def max_diff(a: Tensor, b: Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.float() - b.float()).abs().max().item()
