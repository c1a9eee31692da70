"""WeightJournal: the refits since start-up as object-store refs, so a restarted replica catches up to the version."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JournalEntry:
    seq: int
    ref: Any  # ray.ObjectRef of a [(name, tensor)] bucket
    names: frozenset[str]
    version: int


class WeightJournal:
    """Refits in order. Once a refit reached every replica (`commit`), older entries whose every tensor it
    overwrote are dropped (the object store then frees them), so the journal holds about one copy of each
    weight; a refit that failed is `forget`-ten and leaves the entries before it intact."""

    def __init__(self) -> None:
        self.entries: list[JournalEntry] = []
        self.next_seq = 0

    def record(self, ref: Any, names: list[str], version: int) -> JournalEntry:
        entry = JournalEntry(self.next_seq, ref, frozenset(names), version)
        self.next_seq += 1
        self.entries.append(entry)
        return entry

    def commit(self, entry: JournalEntry) -> None:
        """The refit reached every replica: compact everything up to it."""
        later: set[str] = set()
        kept: list[JournalEntry] = []
        for e in reversed(self.entries):
            if not e.names <= later:
                kept.append(e)
            if e.seq <= entry.seq:
                later |= e.names
        self.entries = kept[::-1]

    def forget(self, entry: JournalEntry) -> None:
        """Drop an entry whose refit failed: replicas restarted from the checkpoint plus the rest agree again."""
        self.entries = [e for e in self.entries if e.seq != entry.seq]

    def since(self, applied_seq: int) -> list[JournalEntry]:
        """Entries a replica that applied everything up to `applied_seq` (-1: nothing) must still apply, in order."""
        return [e for e in self.entries if e.seq > applied_seq]
