"""The vision encoder through the Triton kernels (interpreter on CPU) equals its torch path."""

from __future__ import annotations

import pytest
import torch
from model_cases import build_prompt

from mm_infer.models import vision_ops

pytestmark = pytest.mark.skipif(vision_ops._kernels is None, reason="triton is not installed on this platform")


@torch.no_grad()
def test_encoder_output_through_kernels_equals_reference(ours, monkeypatch):
    model, cfg = ours
    prompt = build_prompt(cfg, [("image", 1, 4, 6), ("video", 3, 4, 4)], seed=3)
    pixels = torch.cat([prompt.pixel_values, prompt.pixel_values_videos])
    grid = torch.tensor(prompt.image_grids + prompt.video_grids)
    monkeypatch.setenv("MM_INFER_KERNELS", "torch")
    reference = model.encode_vision(pixels, grid)
    calls = []
    real = vision_ops._kernels.vision_rope
    monkeypatch.setattr(vision_ops._kernels, "vision_rope", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setenv("MM_INFER_KERNELS", "triton")
    fused = model.encode_vision(pixels, grid)
    assert len(calls) == cfg.vision.depth  # every block's rope went through the Triton kernel
    assert torch.equal(fused, reference)
