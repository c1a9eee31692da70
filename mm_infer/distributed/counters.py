"""Replica counters that never go down: a restarted replica counts from 0 again, so each slot banks what it had."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mm_infer.engine.outputs.request_stats import PREFIX

# engine stats() keys that only grow over one engine's life (and every key of vLLM's series, starting with PREFIX)
COUNTER_KEYS = ("prefix_query_tokens", "prefix_hit_tokens", "encoder_cache_hits", "encoder_calls", "preemptions")


def counter_keys(*readings: Mapping[str, Any]) -> list[str]:
    """COUNTER_KEYS and the vLLM series keys any of the readings has."""
    extra = sorted({k for r in readings for k in r if k.startswith(PREFIX)})
    return [*COUNTER_KEYS, *extra]


@dataclass(frozen=True)
class SlotCounters:
    """One replica slot: what its earlier incarnations counted (`banked`) and the last reading of `incarnation`."""

    incarnation: int = 0
    banked: Mapping[str, float] = field(default_factory=dict)
    last: Mapping[str, float] = field(default_factory=dict)

    def totals(self) -> dict[str, float]:
        return {k: self.banked.get(k, 0.0) + self.last.get(k, 0.0) for k in counter_keys(self.banked, self.last)}


def fold_reading(prev: SlotCounters, incarnation: int, reading: Mapping[str, Any]) -> SlotCounters:
    """`prev` after a health check of `incarnation` read `reading` (a ping). A newer incarnation counts from 0, so
    the last reading is banked first; a counter below its last reading in the same incarnation was reset and is
    banked too; a late reading from an older incarnation, or a key the reading lacks, changes nothing."""
    if incarnation < prev.incarnation:
        return prev
    keys = counter_keys(reading, prev.last, prev.banked)
    if incarnation > prev.incarnation:
        return SlotCounters(incarnation, prev.totals(), {k: float(reading.get(k, 0)) for k in keys})
    now = {k: float(reading[k]) if k in reading else prev.last.get(k, 0.0) for k in keys}
    banked = {k: prev.banked.get(k, 0.0) + (prev.last.get(k, 0.0) if now[k] < prev.last.get(k, 0.0) else 0.0)
              for k in keys}
    return SlotCounters(incarnation, banked, now)


def pool_counters(slots: Iterable[SlotCounters]) -> dict[str, float]:
    """The pool's counters: every slot's totals, summed (never below what an earlier call returned)."""
    total = dict.fromkeys(COUNTER_KEYS, 0.0)
    for slot in slots:
        for k, v in slot.totals().items():
            total[k] = total.get(k, 0.0) + v
    return total
