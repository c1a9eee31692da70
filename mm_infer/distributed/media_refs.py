"""Media through the object store once: a request travels light, its media (uint8 frames, or rows) by reference."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

import numpy as np
import ray
import torch

from mm_infer.media.packed import PackedTensor
from mm_infer.prompt.request import MediaItem, VLMRequest

Stored = tuple  # (array, dtype name) for rows; (uint8 frames [T, 3, H, W], "frames", backend, PatchSpec) for frames


def _to_store(pixels: torch.Tensor) -> Stored:
    """Rows as numpy (read zero-copy by replicas) and the torch dtype name."""
    t = pixels.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: ship the bits
        return t.view(torch.int16).numpy(), "bfloat16"
    return t.numpy(), str(t.dtype).removeprefix("torch.")


def _from_store(stored: Stored) -> torch.Tensor:
    array, dtype = stored[:2]
    t = torch.from_numpy(np.array(array))  # the store's buffer is read-only: one small copy makes it ours
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


def _media_to_store(media: PackedTensor) -> Stored:
    """One item's media: its uint8 frames (a quarter of the float32 rows' bytes) when it has them, else rows."""
    if media.frames is None:
        return _to_store(media.pixel_values)
    return media.frames[0].detach().cpu().numpy(), "frames", media.backend, media.spec


def _media_from_store(stored: Stored) -> torch.Tensor | PackedTensor:
    if stored[1] != "frames":
        return _from_store(stored)
    return PackedTensor.from_frames([_from_store(stored)], backend=stored[2], spec=stored[3])


class MediaRefCache:
    """Content hash -> ObjectRef of that item's pixel values, LRU-bounded by bytes. A GRPO group's n requests, or
    every request about one video, put the pixels in the object store once; dropping a ref lets Ray free it once
    no replica still reads it."""

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self._refs: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self.puts = 0
        self.hits = 0

    def _ref(self, content_hash: str, media: PackedTensor | torch.Tensor) -> Any:
        if content_hash and content_hash in self._refs:
            self._refs.move_to_end(content_hash)
            self.hits += 1
            return self._refs[content_hash][0]
        if isinstance(media, torch.Tensor):
            ref, size = ray.put(_to_store(media)), media.numel() * media.element_size()
        else:
            ref, size = ray.put(_media_to_store(media)), media.nbytes
        self.puts += 1
        if content_hash and size <= self.max_bytes:
            self._refs[content_hash] = (ref, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, old) = self._refs.popitem(last=False)
                self._bytes -= old
        return ref

    def detach(self, request: VLMRequest) -> tuple[VLMRequest, list[Any]]:
        """The request without its media (small enough to travel inline) and one ref per media item."""
        refs = [self._ref(item.content_hash, _media_of(item)) for item in request.items]
        items = [dataclasses.replace(item, media=None) for item in request.items]
        return dataclasses.replace(request, items=items), refs


def attach(request: VLMRequest, stored: list[Stored]) -> VLMRequest:
    """The replica side of detach(): the same request with its media back."""
    items = [dataclasses.replace(item, media=_media_from_store(s))
             for item, s in zip(request.items, stored, strict=True)]
    return dataclasses.replace(request, items=items)


def _media_of(item: MediaItem) -> PackedTensor:
    if item.media is None:
        raise ValueError(f"media item {item.content_hash[:16]} is already detached")
    return item.media
