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


class EncoderCache:
    """At most max_items embeddings; a weight update bumps the version so stale entries never hit."""

    def __init__(self, max_items: int, weight_version: int = 0) -> None:
        if max_items < 1:
            raise ValueError(f"encoder cache needs room for at least one item, got {max_items}")
        self.max_items = max_items
        self.weight_version = weight_version
        self._entries: OrderedDict[tuple[str, int], Tensor] = OrderedDict()
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
        self._entries[(content_hash, self.weight_version)] = embeddings
        self._entries.move_to_end((content_hash, self.weight_version))
        while len(self._entries) > self.max_items:
            self._entries.popitem(last=False)
            self.stats.evictions += 1

    def clear(self) -> None:
        self._entries.clear()

    def set_weight_version(self, version: int) -> None:
        """New weights: drop everything computed with the old ones."""
        self.weight_version = version
        self._entries.clear()
