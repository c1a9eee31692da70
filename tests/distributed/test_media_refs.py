"""Pixel values by reference: exact round trips in every dtype, one put per content hash, a byte-bounded LRU."""

from __future__ import annotations

import dataclasses

import pytest
import ray
import torch

from mm_infer.distributed.media_refs import MediaRefCache, _from_store, _to_store, attach
from mm_infer.prompt.request import MediaItem, VLMRequest


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_store_round_trip_is_bit_exact(dtype):
    pixels = torch.randn(37, 1176).to(dtype)
    back = _from_store(_to_store(pixels))
    assert back.dtype == dtype and torch.equal(back.view(torch.int16 if dtype != torch.float32 else torch.int32),
                                               pixels.view(torch.int16 if dtype != torch.float32 else torch.int32))


def _request(hashes: list[str], rows: int = 16) -> VLMRequest:
    items = [MediaItem("image", torch.full((rows, 1176), float(i)), (1, 4, 4), h) for i, h in enumerate(hashes)]
    return VLMRequest(prompt_token_ids=[1, 2, 3], placeholders=[], items=items,
                      mrope_positions=torch.zeros(3, 3, dtype=torch.long), mrope_delta=0)


def test_detach_ships_each_hash_once_and_attach_restores_the_request(local_ray):
    cache = MediaRefCache()
    first = _request(["a", "b"])
    light, refs = cache.detach(first)
    assert all(item.pixel_values.numel() == 0 for item in light.items), "the request itself travels light"
    again, refs2 = cache.detach(_request(["b", "a"]))
    assert (cache.puts, cache.hits) == (2, 2) and refs2 == refs[::-1]
    restored = attach(light, ray.get(refs))
    for got, want in zip(restored.items, first.items, strict=True):
        assert torch.equal(got.pixel_values, want.pixel_values)
        assert dataclasses.replace(got, media=want.media) == want


def test_the_cache_is_bounded_by_bytes_and_unhashed_items_are_not_kept(local_ray):
    item_bytes = 16 * 1176 * 4
    cache = MediaRefCache(max_bytes=2 * item_bytes)
    for h in ["a", "b", "c"]:
        cache.detach(_request([h]))
    cache.detach(_request(["a"]))  # evicted by c: put again
    assert cache.puts == 4 and cache.hits == 0
    cache.detach(_request([""]))
    cache.detach(_request([""]))
    assert cache.puts == 6, "items without a content hash are never shared"


def test_frames_travel_as_uint8_a_quarter_of_the_rows(local_ray):
    from pathlib import Path

    from mm_infer.media import preprocess_images
    from mm_infer.prompt.request import items_from_packed

    image = Path(__file__).resolve().parents[2] / "assets" / "media" / "shapes" / "colour_example.png"
    items = items_from_packed("image", preprocess_images([image], max_pixels=200704))
    req = VLMRequest(prompt_token_ids=[1], placeholders=[], items=items,
                     mrope_positions=torch.zeros(3, 1, dtype=torch.long), mrope_delta=0)
    cache = MediaRefCache()
    light, refs = cache.detach(req)
    (stored,) = ray.get(refs)
    assert stored[1] == "frames" and stored[0].dtype.name == "uint8"
    assert stored[0].nbytes * 8 == req.items[0].pixel_values.nbytes  # one picture vs two float32 frames of rows
    back = attach(light, [stored]).items[0]
    assert back.frames is not None and torch.equal(back.pixel_values, req.items[0].pixel_values)
