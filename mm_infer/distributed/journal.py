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
    """Append-only with compaction: an entry whose every tensor was overwritten later is dropped (the object store
    then frees it), so the journal holds at most one copy of each weight."""

    def __init__(self) -> None:
        self.entries: list[JournalEntry] = []
        self.next_seq = 0

    def record(self, ref: Any, names: list[str], version: int) -> JournalEntry:
        entry = JournalEntry(self.next_seq, ref, frozenset(names), version)
        self.next_seq += 1
        self.entries.append(entry)
        later: set[str] = set()
        kept: list[JournalEntry] = []
        for e in reversed(self.entries):
            if not e.names <= later:
                kept.append(e)
            later |= e.names
        self.entries = kept[::-1]
        return entry

    def since(self, applied_seq: int) -> list[JournalEntry]:
        """Entries a replica that applied everything up to `applied_seq` (-1: nothing) must still apply, in order."""
        return [e for e in self.entries if e.seq > applied_seq]
