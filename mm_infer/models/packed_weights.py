"""oneDNN-prepacked copies of half-type weights on CPUs with native half arithmetic, rebuilt when a weight changes.

torch's CPU half GEMM (F.linear on AMX / AVX512-BF16 / AVX512-FP16) reorders the weight into oneDNN's blocked
layout on every call: a decode step reads each weight, writes the reordered copy and reads it again. Reordering it
once and keeping the copy makes the decode GEMMs 1.2-1.45x faster on an AMX Xeon at 2B shapes
(`scripts/bench/half_linear.py`, column "packed"). The cost is memory: a copy of every packed weight. So packing
stops at a byte budget fixed per machine (a quarter of its RAM, MM_INFER_PACKED_BUDGET overrides), and a weight
past it keeps F.linear: the choice depends on the model and the machine, never on timing.

A copy is valid for one (storage, version) of its weight: an in-place refit bumps the weight's version counter and
a swapped storage (adopted file pages, sleep/wake) changes its data pointer, so either rebuilds it on next use;
`forget()` drops every copy (sleep, tests)."""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

BUDGET_ENV = "MM_INFER_PACKED_BUDGET"  # bytes of packed copies at most ("0" turns packing off)
BATCH_HINT = 16  # rows oneDNN picks the blocked layout for: a decode batch (prefill rows run fine on it too)


@dataclass
class _Entry:
    owner: weakref.ref  # the weight the copy was made from
    key: tuple[int, int]  # (data pointer, version) of the weight when packed
    packed: Tensor  # opaque oneDNN tensor
    nbytes: int


_entries: dict[int, _Entry] = {}  # id(weight) -> its packed copy
_lock = threading.RLock()  # re-entrant: a weight's finaliser may run (GC) while packed() holds it


def available() -> bool:
    """Whether this torch build has oneDNN's prepacked linear ops."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight") and hasattr(
        ops, "_linear_pointwise")


def _mem_total_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@lru_cache(maxsize=1)
def budget_bytes() -> int:
    """Bytes of packed copies this process may hold: MM_INFER_PACKED_BUDGET, else a quarter of the machine's RAM."""
    value = os.environ.get(BUDGET_ENV, "").strip()
    return int(value) if value else _mem_total_bytes() // 4


def held_bytes() -> int:
    return sum(e.nbytes for e in _entries.values())


def _version(weight: Tensor) -> int:
    try:
        return weight._version
    except RuntimeError:  # an inference tensor tracks no version: only its storage identifies it
        return -1


def packed(weight: Tensor) -> Tensor | None:
    """The prepacked copy of weight [N, K] (made now if missing or stale), or None when the budget is spent."""
    key = (weight.data_ptr(), _version(weight))
    with _lock:
        entry = _entries.get(id(weight))
        if entry is not None and entry.owner() is weight and entry.key == key:
            return entry.packed
        if entry is not None:
            del _entries[id(weight)]
        nbytes = weight.numel() * weight.element_size()
        if held_bytes() + nbytes > budget_bytes():
            return None
        copy = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), BATCH_HINT)
        wid = id(weight)
        owner = weakref.ref(weight, lambda _ref: _drop(wid, _ref))
        _entries[wid] = _Entry(owner, key, copy, nbytes)
        return copy


def _drop(wid: int, ref: weakref.ref) -> None:
    with _lock:
        if (entry := _entries.get(wid)) is not None and entry.owner is ref:
            del _entries[wid]


def forget() -> None:
    """Drop every packed copy (their memory goes back at once; weights pack again on next use)."""
    with _lock:
        _entries.clear()


def packed_linear(x: Tensor, packed_weight: Tensor, bias: Tensor | None) -> Tensor:
    """x [..., K] @ W.T (+ bias [N]) -> [..., N] through oneDNN with the prepacked weight."""
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], "")
