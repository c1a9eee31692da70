"""StateSlots: torch-free bookkeeping of a hybrid model's recurrent-state pool. Each running sequence holds one live
slot; snapshot slots keep the state at a prefix-cache boundary, tied to the KV block that ends there."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class StateSlotStats:
    snapshots_taken: int = 0  # states kept at a boundary
    snapshots_evicted: int = 0  # dropped to make room for a newer one
    restores: int = 0  # sequences that started from a snapshot (prefix hits, n-sample forks)


class StateSlots:
    """Slots [0, live) are live (one per running sequence); [live, live + snapshots) hold snapshots. A snapshot's
    owner is the block whose end it describes; `evictable` says whether that block may give it up (unpinned)."""

    def __init__(self, live: int, snapshots: int) -> None:
        self.live, self.snapshots = live, snapshots
        self.free_live: list[int] = list(range(live - 1, -1, -1))  # pop() hands out the lowest first
        self.free_snapshots: list[int] = list(range(live + snapshots - 1, live - 1, -1))
        self.owner: OrderedDict[int, int] = OrderedDict()  # snapshot slot -> block id, oldest first
        self.stats = StateSlotStats()

    @property
    def total(self) -> int:
        return self.live + self.snapshots

    def take_live(self) -> int | None:
        return self.free_live.pop() if self.free_live else None

    def give_live(self, slot: int) -> None:
        assert slot < self.live and slot not in self.free_live, f"live slot {slot} given back twice"
        self.free_live.append(slot)

    def take_snapshot(self, evictable) -> tuple[int, int | None] | None:  # noqa: ANN001 - (block id) -> bool
        """(a snapshot slot, the block that loses it or None): a free slot, else the oldest one whose block
        `evictable` allows; None when every slot is pinned."""
        if self.free_snapshots:
            return self.free_snapshots.pop(), None
        for slot, block in self.owner.items():
            if evictable(block):
                del self.owner[slot]
                self.stats.snapshots_evicted += 1
                return slot, block
        return None

    def own(self, slot: int, block: int) -> None:
        """A snapshot slot now belongs to (the end of) a cached block."""
        self.owner[slot] = block
        self.stats.snapshots_taken += 1

    def touch(self, slot: int) -> None:
        """A hit used this snapshot: it is evicted last."""
        self.owner.move_to_end(slot)

    def give_snapshot(self, slot: int) -> None:
        self.owner.pop(slot, None)
        assert slot >= self.live and slot not in self.free_snapshots, f"snapshot slot {slot} given back twice"
        self.free_snapshots.append(slot)

    def check_invariants(self, live_held: list[int], pending: list[int]) -> None:
        """Every live slot is free or held by exactly one live sequence; every snapshot slot is free, owned by a
        block or pending (a sequence's chunk is writing it), exactly one of them."""
        assert sorted(self.free_live + live_held) == list(range(self.live)), "live slots leaked or held twice"
        snaps = self.free_snapshots + list(self.owner) + pending
        assert sorted(snaps) == list(range(self.live, self.total)), "snapshot slots leaked or held twice"


def state_slots(model: object, config: object) -> StateSlots | None:
    """A hybrid model's slots: one live per running sequence (max_num_seqs) and `state_snapshots` snapshots
    (default max_num_seqs; none without prefix caching); None for a model without recurrent state."""
    if not getattr(model, "has_recurrent_state", False):
        return None
    live = config.scheduler.max_num_seqs  # type: ignore[attr-defined]
    cache = config.cache  # type: ignore[attr-defined]
    snapshots = live if cache.state_snapshots is None else cache.state_snapshots
    return StateSlots(live, snapshots if cache.enable_prefix_caching else 0)
