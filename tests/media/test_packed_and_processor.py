"""PackedTensor operations, input equivalence, EXIF handling, and the parallel cached MediaProcessor."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
import torch
from media_paths import IMAGES, VIDEOS
from PIL import Image

from mm_infer.media import MediaProcessor, PackedTensor, preprocess_images

KW = {"min_pixels": 3136, "max_pixels": 200704}
NAMES = ["photo_q90.jpg", "tiny_9x13.png", "strip_wide.png", "rgba.png"]


def test_split_concat_roundtrip_and_token_counts() -> None:
    packed = preprocess_images([IMAGES / n for n in NAMES], **KW)
    parts = packed.split()
    assert [len(p) for p in parts] == [1] * len(NAMES)
    again = PackedTensor.concat(parts)
    assert torch.equal(again.pixel_values, packed.pixel_values)
    assert again.content_hashes == packed.content_hashes
    assert packed.tokens_per_item() == [int(g.prod()) // 4 for g in packed.imgs_sizes]
    assert len(PackedTensor.concat([])) == 0
    assert packed.to("cpu", torch.bfloat16).pixel_values.dtype == torch.bfloat16


def test_packed_tensor_validates_shapes() -> None:
    with pytest.raises(ValueError, match="rows"):
        PackedTensor(torch.zeros(3, 1176), torch.tensor([[1, 2, 2]]), torch.tensor([1]))
    with pytest.raises(ValueError, match="imgs_sizes"):
        PackedTensor(torch.zeros(4, 1176), torch.tensor([1, 2, 2]), torch.tensor([1]))


def test_bytes_data_url_path_and_pil_give_the_same_pixels() -> None:
    path = IMAGES / "photo.webp"
    data = path.read_bytes()
    url = "data:image/webp;base64," + base64.b64encode(data).decode()
    outs = [preprocess_images([x], **KW) for x in (path, data, url, str(path), "file://" + str(path))]
    pil = preprocess_images([Image.open(path)], **KW)
    arr = preprocess_images([np.asarray(Image.open(path).convert("RGB"))], **KW)
    for other in outs[1:] + [pil, arr]:
        assert torch.equal(other.pixel_values, outs[0].pixel_values)
    assert len({o.content_hashes[0] for o in outs}) == 1  # same bytes, same options: same hash


def test_exif_orientation_applied_to_bytes_by_default_not_to_pil() -> None:
    path = IMAGES / "exif_rotate90.jpg"  # stored 451x300, orientation 6
    rotated = preprocess_images([path], **KW)
    stored = preprocess_images([path], exif_transpose=False, **KW)
    pil = preprocess_images([Image.open(path)], **KW)
    assert rotated.imgs_sizes[0].tolist() == [1, 32, 22]
    assert stored.imgs_sizes[0].tolist() == [1, 22, 32]
    assert torch.equal(pil.pixel_values, stored.pixel_values)


def test_media_processor_matches_sequential_and_caches() -> None:
    items = [IMAGES / n for n in NAMES] * 2
    expected = preprocess_images(items, **KW)
    with MediaProcessor(max_workers=2) as mp:
        got = mp.process_images(items, **KW)
        assert torch.equal(got.pixel_values, expected.pixel_values)
        assert got.content_hashes == expected.content_hashes
        assert mp.cache.misses >= len(NAMES)
        hits = mp.cache.hits
        mp.process_images(items, **KW)
        assert mp.cache.hits == hits + len(items)
        videos, metas = mp.process_videos([VIDEOS / "odd7_h264_2fps.mp4"], min_pixels=3136, max_pixels=100352)
        assert metas[0].frame_indices == [0, 1, 2, 3, 4, 5] and len(videos) == 1  # HF's rule: 6 of 7 frames


def test_media_processor_async_and_errors_propagate() -> None:
    from mm_infer.media import MediaDecodeError

    async def run() -> tuple[PackedTensor, list]:
        with MediaProcessor(max_workers=2) as mp:
            return await mp.aprocess("image", [IMAGES / "tiny_9x13.png"], **KW)

    packed, metas = asyncio.run(run())
    assert packed.imgs_sizes.tolist() == [[1, 6, 4]] and metas == [None]
    with MediaProcessor(max_workers=2) as mp, pytest.raises(MediaDecodeError):
        mp.process_images([IMAGES / "tiny_9x13.png", b"not an image at all"], **KW)


def test_cache_is_bounded_by_bytes() -> None:
    with MediaProcessor(max_workers=1, cache_bytes=300_000) as mp:
        for name in NAMES:
            mp.process_images([IMAGES / name], **KW)
        assert mp.cache.nbytes <= 300_000
