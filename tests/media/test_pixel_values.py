"""PackedTensor.pixel_values, written in place from the uint8 frames, equals the reference bits at any thread count.

References independent of the rows code: the HF goldens item by item in one multi-image call, and the kernels'
torch reference (normalise every pixel, then patch_rows) for odd and even frame counts and both patch geometries.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from media_paths import GOLDEN_IMAGE_KW, GOLDEN_INDEX, IMAGES

from mm_infer.media import PackedTensor, preprocess_images
from mm_infer.media.patchify import DEFAULT_SPEC, PatchSpec, rows_by_table
from mm_infer_kernels.fused_patchify import patch_rows

QWEN3_SPEC = PatchSpec(patch_size=16, image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _reference(frames: torch.Tensor, backend: str, spec: PatchSpec) -> torch.Tensor:
    x = spec.normalizer(backend).apply(frames.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # [T, 3, H, W] float32
    return patch_rows(x, spec.geometry)


@pytest.mark.parametrize("backend", ["torchvision", "pil"])
def test_multi_image_pixel_values_equal_the_hf_goldens_item_by_item(backend, threads):
    names = sorted(GOLDEN_INDEX["images"])
    packed = preprocess_images([IMAGES / n for n in names], backend=backend, exif_transpose=False, **GOLDEN_IMAGE_KW)
    rows = packed.pixel_values
    assert rows.dtype == torch.float32 and rows.is_contiguous()
    for name, part in zip(names, torch.split(rows, packed.patches_per_item), strict=True):
        ref = GOLDEN_INDEX["images"][name][backend]
        assert list(part.shape) == ref["shape"]
        assert hashlib.sha256(np.ascontiguousarray(part.numpy()).tobytes()).hexdigest() == ref["sha256"], name


@pytest.mark.parametrize("spec", [DEFAULT_SPEC, QWEN3_SPEC], ids=["patch14", "patch16"])
@pytest.mark.parametrize("backend", ["torchvision", "pil"])
def test_pixel_values_equal_the_torch_reference_for_odd_and_even_frame_counts(backend, spec, threads):
    gen = torch.Generator().manual_seed(0)
    f = spec.factor
    frames = [torch.randint(0, 256, (t, 3, f * h, f * w), dtype=torch.uint8, generator=gen)
              for t, h, w in [(1, 2, 3), (2, 1, 1), (3, 3, 2), (4, 1, 2), (5, 2, 1)]]
    packed = PackedTensor.from_frames(frames, backend=backend, spec=spec)
    want = torch.cat([_reference(x, backend, spec) for x in frames])
    assert torch.equal(packed.pixel_values, want)
    assert torch.equal(packed.frame_batch().embed(torch.eye(spec.row_width)), want @ torch.eye(spec.row_width))


def test_rows_by_table_writes_into_out_and_checks_it():
    frames = torch.randint(0, 256, (1, 3, 28, 56), dtype=torch.uint8)
    norm, geometry = DEFAULT_SPEC.normalizer("torchvision"), DEFAULT_SPEC.geometry
    out = torch.full((8, geometry.width), float("nan"))
    assert rows_by_table(frames, norm, geometry, out) is out
    assert torch.equal(out, _reference(frames, "torchvision", DEFAULT_SPEC))
    with pytest.raises(ValueError, match="out must be"):
        rows_by_table(frames, norm, geometry, torch.empty(7, geometry.width))
    with pytest.raises(ValueError, match="multiple"):
        rows_by_table(torch.zeros(1, 3, 28, 30, dtype=torch.uint8), norm, geometry)
