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


@torch.no_grad()
def test_cpu_frames_embed_in_groups_equal_one_matmul_over_all_rows(ours, monkeypatch: pytest.MonkeyPatch) -> None:
    """Items of 4, 6, 12, 24 and 64 patches: the grouped table-lookup embed (each group >= 16 rows, no batch-wide
    rows tensor) has the bits of rows for the whole batch times the weight. A group of fewer rows, or rows made with
    other float arithmetic, would show here."""
    model, cfg = ours
    monkeypatch.setenv("MM_INFER_KERNELS", "torch")
    v = cfg.vision
    spec = PatchSpec(v.patch_size, v.temporal_patch_size, v.spatial_merge_size)
    unit, gen = spec.factor, torch.Generator().manual_seed(1)
    shapes = [(1, 1, 1), (1, 1, 2), (3, 1, 2), (1, 2, 3), (1, 4, 4), (2, 2, 2)]  # (frames, h units, w units)
    frames = [torch.randint(0, 256, (t, 3, h * unit, w * unit), dtype=torch.uint8, generator=gen)
              for t, h, w in shapes]
    packed = PackedTensor.from_frames(frames, spec=spec)
    batch = packed.frame_batch()
    groups = batch.row_chunks()
    sizes = [sum(batch.grids[i][0] * batch.grids[i][1] * batch.grids[i][2] for i in g) for g in groups]
    assert len(groups) > 1 and min(sizes) >= 16 and [i for g in groups for i in g] == list(range(len(shapes)))
    weight = model.visual.patch_embed.weight
    whole = packed.pixel_values.to(weight.dtype) @ weight.reshape(weight.shape[0], -1).t()  # [P, D]
    assert torch.equal(batch.embed(weight), whole)
    rows = model.encode_vision(packed.pixel_values, packed.imgs_sizes.tolist())
    assert torch.equal(model.encode_frames(batch), rows)


def test_row_groups_never_leave_a_short_tail() -> None:
    from mm_infer.media.frame_batch import FrameBatch

    def groups(patch_counts: list[int]) -> list[list[int]]:
        fb = FrameBatch(torch.empty(0, dtype=torch.uint8), tuple(0 for _ in patch_counts),
                        tuple((2, 14 * n, 14) for n in patch_counts), None, PatchSpec().geometry)
        return fb.row_chunks()

    assert groups([4]) == [[0]]  # alone, fewer rows than a group: one matmul, as the batch would be
    assert groups([4, 4, 4, 4]) == [[0, 1, 2, 3]]
    assert groups([20, 4]) == [[0, 1]]  # the 4-row tail joins the group before it
    assert groups([20, 20, 16]) == [[0], [1], [2]]
