"""uint8 frames form: rows on demand bit for bit, a quarter of the bytes, kept through split/concat/to and MediaItem."""

from __future__ import annotations

import pytest
import torch
from media_paths import IMAGES, VIDEOS

from mm_infer.media import PackedTensor, preprocess_images, preprocess_videos
from mm_infer.media.patchify import frames_to_rows
from mm_infer.prompt.request import MediaItem, items_from_packed

KW = {"min_pixels": 3136, "max_pixels": 200704}
NAMES = ["photo_q90.jpg", "tiny_9x13.png", "strip_wide.png"]


@pytest.mark.parametrize("backend", ["torchvision", "pil"])
def test_processor_keeps_uint8_frames_and_rows_come_out_bit_for_bit(backend):
    packed = preprocess_images([IMAGES / n for n in NAMES], backend=backend, **KW)
    assert packed.has_frames and all(f.dtype == torch.uint8 and f.shape[:2] == (1, 3) for f in packed.frames)
    want = torch.cat([frames_to_rows(f, backend)[0] for f in packed.frames])
    assert torch.equal(packed.pixel_values, want)
    assert packed.nbytes * 8 == packed.pixel_values.nbytes, "uint8 [1, 3, H, W] vs float32 rows over 2 frames"
    rows = PackedTensor(packed.pixel_values, packed.imgs_sizes, packed.num_frames, packed.content_hashes)
    assert not rows.has_frames and torch.equal(rows.pixel_values, want)


def test_split_concat_and_to_keep_frames_and_to_dtype_gives_rows():
    packed = preprocess_images([IMAGES / n for n in NAMES], **KW)
    parts = packed.split()
    assert all(p.has_frames and len(p) == 1 for p in parts)
    again = PackedTensor.concat(parts)
    assert again.has_frames and again.content_hashes == packed.content_hashes
    assert torch.equal(again.pixel_values, packed.pixel_values)
    assert packed.to("cpu").has_frames
    half = packed.to("cpu", torch.bfloat16)
    assert not half.has_frames and torch.equal(half.pixel_values, packed.pixel_values.to(torch.bfloat16))
    mixed = PackedTensor.concat([parts[0], PackedTensor(parts[1].pixel_values, parts[1].imgs_sizes,
                                                         parts[1].num_frames, parts[1].content_hashes)])
    assert not mixed.has_frames and torch.equal(mixed.pixel_values, packed.pixel_values[:mixed.pixel_values.shape[0]])


def test_video_frames_odd_count_rows_equal_and_batch_rows_equal():
    videos, _ = preprocess_videos([VIDEOS / "odd7_h264_2fps.mp4"], min_pixels=3136, max_pixels=100352)
    (frames,) = videos.frames
    assert frames.shape[0] == int(videos.num_frames[0]) == 6
    assert torch.equal(videos.pixel_values, frames_to_rows(frames, "torchvision")[0])
    both = PackedTensor.concat([videos, preprocess_images([IMAGES / NAMES[0]], **KW)])
    assert torch.equal(both.frame_batch().rows(), both.pixel_values), "the device path's torch rows are the same"


def test_frame_batch_embed_equals_rows_matmul():
    packed = preprocess_images([IMAGES / n for n in NAMES], **KW)
    weight = torch.randn(32, 1176)
    assert torch.equal(packed.frame_batch().embed(weight), packed.pixel_values @ weight.t())


def test_frames_must_match_the_grid_and_be_uint8():
    with pytest.raises(ValueError, match="uint8"):
        PackedTensor(None, torch.tensor([[1, 2, 2]]), torch.tensor([1]), frames=[torch.zeros(1, 3, 28, 28)])
    with pytest.raises(ValueError, match="grid"):
        PackedTensor(None, torch.tensor([[1, 4, 2]]), torch.tensor([1]),
                     frames=[torch.zeros(1, 3, 28, 28, dtype=torch.uint8)])
    with pytest.raises(ValueError, match="either"):
        PackedTensor(None, torch.tensor([[1, 2, 2]]), torch.tensor([1]))


def test_media_item_carries_frames_and_still_takes_rows():
    packed = preprocess_images([IMAGES / NAMES[0]], **KW)
    (item,) = items_from_packed("image", packed)
    assert item.frames is not None and item.nbytes == packed.nbytes
    assert torch.equal(item.pixel_values, packed.pixel_values) and item.num_patches == packed.pixel_values.shape[0]
    rows = MediaItem("image", packed.pixel_values, item.grid_thw, item.content_hash)
    assert rows.frames is None and torch.equal(rows.pixel_values, item.pixel_values)
    assert rows.nbytes == 4 * 2 * item.nbytes
