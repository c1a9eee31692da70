"""Router, affinity keys, weight journal and snapshot coalescing: pure Python, no Ray actors."""

from __future__ import annotations

import asyncio

import pytest
import torch

from mm_infer.distributed.coalesce import coalesced
from mm_infer.distributed.errors import ReplicaUnavailableError, describe_failure
from mm_infer.distributed.journal import WeightJournal
from mm_infer.distributed.router import Router, affinity_key
from mm_infer.prompt.placeholders import PlaceholderRange
from mm_infer.prompt.request import VLMRequest


def test_unkeyed_requests_go_to_the_least_loaded_replica_and_ties_rotate():
    router = Router(3)
    assert [router.pick(None) for _ in range(3)] == [0, 1, 2]
    router.release(1)
    assert router.pick(None) == 1, "replica 1 is the only one with a free slot"
    router.load = [5, 2, 9]
    assert router.pick(None, weight=4) == 1
    assert router.load == [5, 6, 9]


def test_a_key_sticks_to_its_first_replica_and_counts_hits():
    router = Router(2)
    first = router.pick("group-a", weight=1)
    other = router.pick("group-b", weight=1)
    assert first != other, "the second group goes to the idle replica"
    assert all(router.pick("group-a") == first for _ in range(7))
    assert router.stats.keyed_repeat == 7 and router.stats.affinity_hits == 7 and router.stats.hit_rate == 1.0
    assert router.load[first] == 8


def test_an_overloaded_pinned_replica_spills_without_losing_the_pin():
    router = Router(2, spill_slack=4)
    pinned = router.pick("hot")
    router.load[pinned] = 10
    assert router.pick("hot") != pinned
    assert router.stats.spills == 1 and router.pinned("hot") == pinned
    router.load[pinned] = 0
    assert router.pick("hot") == pinned


def test_a_down_replica_loses_its_keys_and_no_replica_up_is_a_503():
    router = Router(2)
    pinned = router.pick("k")
    router.set_up(pinned, False)
    moved = router.pick("k")
    assert moved != pinned and router.pinned("k") == moved and router.stats.repins == 1
    router.set_up(moved, False)
    with pytest.raises(ReplicaUnavailableError, match="no engine replica is up") as info:
        router.pick(None)
    assert info.value.status == 503


def test_release_never_goes_negative_and_pins_are_bounded():
    router = Router(2, max_keys=3)
    router.release(0, 5)
    assert router.load == [0, 0]
    for key in "abcd":
        router.pick(key)
    assert router.pinned("a") is None and router.pinned("d") is not None
    with pytest.raises(ValueError, match="at least one replica"):
        Router(0)


def _request(ids: list[int], hashes: list[str]) -> VLMRequest:
    placeholders = [PlaceholderRange(i, 1, "image", h, i) for i, h in enumerate(hashes)]
    return VLMRequest(prompt_token_ids=ids, placeholders=placeholders, items=[], mrope_positions=torch.zeros(3, 0),
                      mrope_delta=0)


def test_affinity_key_prefers_the_caller_then_media_then_the_prompt():
    with_media = _request([1, 2, 3], ["abc", "def"])
    assert affinity_key(with_media, "session-7") == "key:session-7"
    assert affinity_key(with_media) == "media:abc"
    same = affinity_key(_request([1, 2, 3], []))
    assert same == affinity_key(_request([1, 2, 3], [])) and same.startswith("prompt:")
    assert same != affinity_key(_request([1, 2, 4], []))


def test_weight_journal_drops_entries_overwritten_by_a_committed_refit():
    journal = WeightJournal()
    a = journal.record("ref-a", ["x", "y"], 1)
    journal.commit(a)
    b = journal.record("ref-b", ["y"], 2)
    journal.commit(b)
    assert [e.ref for e in journal.since(-1)] == ["ref-a", "ref-b"]
    c = journal.record("ref-c", ["x"], 3)
    assert [e.ref for e in journal.since(-1)] == ["ref-a", "ref-b", "ref-c"], "nothing dropped before the commit"
    journal.commit(c)
    assert [e.ref for e in journal.since(-1)] == ["ref-b", "ref-c"], "every tensor of ref-a was overwritten"
    assert [e.ref for e in journal.since(b.seq)] == ["ref-c"]
    assert journal.since(c.seq) == [] and a.seq < b.seq < c.seq


def test_a_failed_refit_is_forgotten_and_leaves_the_older_weights():
    journal = WeightJournal()
    journal.commit(journal.record("ref-a", ["x"], 1))
    bad = journal.record("ref-bad", ["x"], 2)
    journal.forget(bad)
    assert [e.ref for e in journal.since(-1)] == ["ref-a"]


def test_describe_failure_is_one_bounded_line():
    assert describe_failure(RuntimeError("first line\nsecond")) == "RuntimeError: first line"
    assert len(describe_failure(RuntimeError("x" * 1000), limit=50)) <= len("RuntimeError: ") + 50
    assert describe_failure(KeyError()) == "KeyError"


async def _source(items: list[int], delay: float, fail: bool = False):
    for item in items:
        await asyncio.sleep(delay)
        yield item
    if fail:
        raise ValueError("source broke")


def _joined(items: list[int], delay: float, interval: float) -> list[list[int]]:
    async def run() -> list[list[int]]:
        return [x async for x in coalesced(_lists(items, delay), interval, lambda a, b: a + b)]

    return asyncio.run(run())


async def _lists(items: list[int], delay: float):
    async for item in _source(items, delay):
        yield [item]


def test_coalesced_joins_the_deltas_that_wait_and_drops_none():
    # the source never sleeps: it runs ahead while the consumer waits its interval (catches a coalescer that keeps
    # only the newest delta, which loses tokens)
    got = _joined(list(range(20)), 0.0, 0.05)
    assert [x for joined in got for x in joined] == list(range(20)) and len(got) < 20


def test_coalesced_with_no_interval_passes_everything_through_in_order():
    assert _joined(list(range(5)), 0.005, 0.0) == [[0], [1], [2], [3], [4]]


def test_coalesced_reraises_source_errors_after_the_items_before_them():
    async def run() -> list[int]:
        got = []
        with pytest.raises(ValueError, match="source broke"):
            async for x in coalesced(_source([1, 2], 0.001, fail=True), 0.0, max):
                got.append(x)
        return got

    assert asyncio.run(run())[-1] == 2


def test_closing_coalesced_cancels_the_source():
    closed = asyncio.Event()

    async def endless():
        try:
            while True:
                await asyncio.sleep(0.001)
                yield 1
        finally:
            closed.set()

    async def run() -> bool:
        stream = coalesced(endless(), 0.0, max)
        await stream.__anext__()
        await stream.aclose()
        return closed.is_set()

    assert asyncio.run(run())
