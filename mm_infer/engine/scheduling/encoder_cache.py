"""EncoderCache: vision embeddings keyed by (content hash, weight version), bounded, LRU eviction."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from torch import Tensor


@dataclass
class EncoderCacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


class EncoderCache:
    """At most max_items embeddings and max_bytes of them; a weight update bumps the version so stale entries
    never hit. An item larger than max_bytes on its own is not kept."""

    def __init__(self, max_items: int, weight_version: int = 0, max_bytes: int | None = None) -> None:
        if max_items < 1:
            raise ValueError(f"encoder cache needs room for at least one item, got {max_items}")
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.weight_version = weight_version
        self._entries: OrderedDict[tuple[str, int], Tensor] = OrderedDict()
        self.bytes = 0  # held by the entries
        self.stats = EncoderCacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, content_hash: str) -> bool:
        return (content_hash, self.weight_version) in self._entries

    def get(self, content_hash: str) -> Tensor | None:
        key = (content_hash, self.weight_version)
        emb = self._entries.get(key)
        if emb is None:
            self.stats.misses += 1
            return None
        self._entries.move_to_end(key)
        self.stats.hits += 1
        return emb

    def put(self, content_hash: str, embeddings: Tensor) -> None:
        """embeddings [tokens, D] for one item."""
        size = _nbytes(embeddings)
        if self.max_bytes is not None and size > self.max_bytes:
            return
        key = (content_hash, self.weight_version)
        old = self._entries.pop(key, None)
        self.bytes += size - (0 if old is None else _nbytes(old))
        self._entries[key] = embeddings
        while len(self._entries) > self.max_items or (self.max_bytes is not None and self.bytes > self.max_bytes):
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= _nbytes(evicted)
            self.stats.evictions += 1

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def set_weight_version(self, version: int) -> None:
        """New weights: drop everything computed with the old ones."""
        self.weight_version = version
        self.clear()
