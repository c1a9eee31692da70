"""The vision tower runs the kernels' ops: their torch references on CPU, and Triton (interpreter here) bit-equal."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from model_cases import build_prompt

from mm_infer_kernels import vision_rope as vr

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count the calls the tower makes to mm_infer_kernels.vision_rope.<name> (dispatch looks it up per call)."""
    calls: list[int] = []
    real = getattr(vr, name)
    monkeypatch.setattr(vr, name, lambda *a: calls.append(1) or real(*a))
    return calls


def vision_inputs(cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(pixel_values [P, patch_dim], grid_thw [2, 3]) of one image and one video."""
    prompt = build_prompt(cfg, [("image", 1, 4, 6), ("video", 3, 4, 4)], seed=3)
    grid = torch.tensor(prompt.image_grids + prompt.video_grids)  # [2, 3]
    return torch.cat([prompt.pixel_values, prompt.pixel_values_videos]), grid


@torch.no_grad()
def test_cpu_encoder_uses_the_kernels_torch_path(ours, monkeypatch: pytest.MonkeyPatch) -> None:
    model, cfg = ours
    monkeypatch.delenv("MM_INFER_KERNELS", raising=False)
    calls = counting(monkeypatch, "vision_rope_torch")
    model.encode_vision(*vision_inputs(cfg))
    assert len(calls) == cfg.vision.depth  # every block's rope is kernels' torch path (bit-equal to the reference)


@needs_triton
@torch.no_grad()
def test_encoder_output_through_kernels_equals_reference(ours, monkeypatch: pytest.MonkeyPatch) -> None:
    model, cfg = ours
    pixels, grid = vision_inputs(cfg)
    monkeypatch.setenv("MM_INFER_KERNELS", "torch")
    reference = model.encode_vision(pixels, grid)
    calls = counting(monkeypatch, "vision_rope_triton")
    monkeypatch.setenv("MM_INFER_KERNELS", "triton")
    fused = model.encode_vision(pixels, grid)
    assert len(calls) == cfg.vision.depth  # every block's rope went through the Triton kernel
    assert torch.equal(fused, reference)
