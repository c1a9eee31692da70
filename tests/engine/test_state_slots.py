"""The hybrid models' recurrent-state bookkeeping without a model: segment pieces, slot allocation, snapshots tied
to KV blocks (hits clamped to a snapshot, dropped with the block's hash, evicted only when unpinned)."""

from __future__ import annotations

import pytest
import torch

from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.engine.scheduling.block_manager import BlockManager
from mm_infer.engine.scheduling.sequence import Sequence, SequenceGroup
from mm_infer.engine.scheduling.state_slots import StateSlots
from mm_infer.models.recurrent_batch import StateSegment
from mm_infer.prompt.request import VLMRequest


def test_pieces_split_at_boundaries_and_snapshots_and_take_generated_tokens_one_by_one():
    # catches: a snapshot kept mid-piece (the state there never exists), a boundary not split (a hit resumes where
    # the cold run did not split), generated tokens scanned as a prompt
    seg = StateSegment(row=0, start=10, length=14, prompt_len=20, read=0, write=0, snapshots=((16, 5),),
                       boundaries=(12, 16))
    assert seg.pieces() == [(0, 2, False, None), (2, 6, False, 5), (6, 10, False, None), (10, 11, True, None),
                            (11, 12, True, None), (12, 13, True, None), (13, 14, True, None)]
    at_end = StateSegment(0, 0, 32, 40, None, 1, snapshots=((16, 6), (32, 7)), boundaries=(16, 32))
    assert at_end.pieces() == [(0, 16, False, 6), (16, 32, False, 7)]
    decode = StateSegment(3, 45, 1, 40, 1, 1)
    assert decode.pieces() == [(0, 1, True, None)]


def test_slots_are_handed_out_once_and_checked():
    slots = StateSlots(live=2, snapshots=2)
    a, b = slots.take_live(), slots.take_live()
    assert {a, b} == {0, 1} and slots.take_live() is None
    (s1, _), (s2, _) = slots.take_snapshot(lambda _b: False), slots.take_snapshot(lambda _b: False)
    assert {s1, s2} == {2, 3} and slots.take_snapshot(lambda _b: False) is None  # every owner pinned
    slots.own(s1, block=7)
    slots.own(s2, block=8)
    assert slots.take_snapshot(lambda block: block == 8) == (s2, 8)  # the oldest evictable one, and its owner
    slots.give_live(a)
    with pytest.raises(AssertionError):
        slots.give_live(a)
    slots.check_invariants([b], [s2])
    with pytest.raises(AssertionError):
        slots.check_invariants([b], [])  # s2 leaked


def _seq(tokens: list[int]) -> Sequence:
    req = VLMRequest(tokens, [], [], torch.arange(len(tokens)).expand(3, -1), 0)
    return Sequence(SequenceGroup("r", SamplingParams(max_tokens=4), req), tokens)


def _computed(bm: BlockManager, seq: Sequence, snapshot_at: int | None) -> None:
    """What a step does to seq: allocate, a snapshot slot for its boundary, compute the prompt, commit."""
    assert bm.allocate(seq, len(seq))
    if snapshot_at is not None:
        seq.pending_snapshots.append((snapshot_at, bm.take_snapshot_slot()))
    seq.num_computed_tokens = len(seq)
    bm.commit(seq)


def test_a_hit_ends_at_a_snapshot_and_the_snapshot_goes_with_the_hash():
    # catches: a hit past the last snapshot (its state does not exist), a snapshot outliving its block's content
    bm = BlockManager(8, 4, states=StateSlots(live=2, snapshots=2))
    tokens = list(range(13))  # blocks [0..4) [4..8) [8..12), the last token computed again
    first = _seq(tokens)
    _computed(bm, first, snapshot_at=8)  # a snapshot at the end of block 1 only
    assert bm.blocks[first.block_table[1]].state_slot is not None and not first.pending_snapshots
    second = _seq(tokens)
    assert bm.match_prefix(second) == 8  # three blocks cached, but the state exists only at 8
    assert second.restore_slot == bm.blocks[first.block_table[1]].state_slot
    bm.check_invariants([first, second])
    bm.free(first)
    bm.free(second)
    assert second.restore_slot is None and len(bm.states.free_live) == 2
    bm.reset_prefix_cache()
    assert len(bm.states.free_snapshots) == 2 and not bm.states.owner
    bm.check_invariants([])


def test_a_pinned_snapshot_is_never_evicted():
    # catches: a sibling's restore slot reused for another prompt's snapshot before the sibling ran
    bm = BlockManager(16, 4, states=StateSlots(live=3, snapshots=1))
    a = _seq(list(range(9)))
    _computed(bm, a, snapshot_at=8)
    b = _seq(list(range(9)))
    assert bm.match_prefix(b) == 8  # b holds a's blocks: the snapshot is pinned
    assert bm.take_snapshot_slot() is None
    bm.free(a)
    bm.free(b)
    slot = bm.take_snapshot_slot()  # unpinned now: the oldest snapshot goes
    assert slot is not None and all(blk.state_slot is None for blk in bm.blocks)
    assert bm.states.stats.snapshots_evicted == 1
