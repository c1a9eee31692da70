"""Media through the object store once: a request travels light, its pixel values by reference, one copy per hash."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

import numpy as np
import ray
import torch

from mm_infer.prompt.request import VLMRequest

_EMPTY = torch.empty(0)
Stored = tuple[np.ndarray, str]  # pixel values as numpy (read zero-copy by replicas) and the torch dtype name


def _to_store(pixels: torch.Tensor) -> Stored:
    t = pixels.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: ship the bits
        return t.view(torch.int16).numpy(), "bfloat16"
    return t.numpy(), str(t.dtype).removeprefix("torch.")


def _from_store(stored: Stored) -> torch.Tensor:
    array, dtype = stored
    t = torch.from_numpy(np.array(array))  # the store's buffer is read-only: one small copy makes it ours
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t


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

    def _ref(self, content_hash: str, pixels: torch.Tensor) -> Any:
        if content_hash and content_hash in self._refs:
            self._refs.move_to_end(content_hash)
            self.hits += 1
            return self._refs[content_hash][0]
        ref = ray.put(_to_store(pixels))
        self.puts += 1
        size = pixels.numel() * pixels.element_size()
        if content_hash and size <= self.max_bytes:
            self._refs[content_hash] = (ref, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, old) = self._refs.popitem(last=False)
                self._bytes -= old
        return ref

    def detach(self, request: VLMRequest) -> tuple[VLMRequest, list[Any]]:
        """The request without pixel values (small enough to travel inline) and one ref per media item."""
        refs = [self._ref(item.content_hash, item.pixel_values) for item in request.items]
        items = [dataclasses.replace(item, pixel_values=_EMPTY) for item in request.items]
        return dataclasses.replace(request, items=items), refs


def attach(request: VLMRequest, stored: list[Stored]) -> VLMRequest:
    """The replica side of detach(): the same request with its pixel values back."""
    items = [dataclasses.replace(item, pixel_values=_from_store(s))
             for item, s in zip(request.items, stored, strict=True)]
    return dataclasses.replace(request, items=items)
