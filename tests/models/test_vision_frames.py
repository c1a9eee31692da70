"""The tower fed uint8 frames (what the engine ships to a device) equals the tower fed today's float rows."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from mm_infer.media import PackedTensor
from mm_infer.media.patchify import PatchSpec

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def frames_of(cfg) -> PackedTensor:
    """An image (1 frame) and an odd-length video (3 frames) of random uint8 pixels at the model's patch size."""
    v = cfg.vision
    spec = PatchSpec(v.patch_size, v.temporal_patch_size, v.spatial_merge_size)
    unit = spec.factor
    gen = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (1, 3, 2 * unit, 3 * unit), dtype=torch.uint8, generator=gen)
    video = torch.randint(0, 256, (3, 3, 2 * unit, 2 * unit), dtype=torch.uint8, generator=gen)
    return PackedTensor.from_frames([image, video], spec=spec)


@torch.no_grad()
def test_frames_through_the_torch_path_equal_rows_bit_for_bit(ours, monkeypatch: pytest.MonkeyPatch) -> None:
    model, cfg = ours
    monkeypatch.setenv("MM_INFER_KERNELS", "torch")
    packed = frames_of(cfg)
    rows = model.encode_vision(packed.pixel_values, packed.imgs_sizes.tolist())
    assert torch.equal(model.encode_frames(packed.frame_batch()), rows)


@needs_triton
@torch.no_grad()
def test_frames_through_the_fused_triton_embed_match_rows(ours, monkeypatch: pytest.MonkeyPatch) -> None:
    model, cfg = ours
    packed = frames_of(cfg)
    rows = model.encode_vision(packed.pixel_values, packed.imgs_sizes.tolist())
    monkeypatch.setenv("MM_INFER_KERNELS", "triton")  # interpreter here: the kernel the engine runs on CUDA
    fused = model.encode_frames(packed.frame_batch())
    torch.testing.assert_close(fused, rows, rtol=1e-4, atol=1e-4)  # fp32 summation order only
