"""Torch-free scheduler and block manager rules under random traffic, aborts and preemption."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mm_infer.config import SchedulerConfig
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.engine.scheduling.block_manager import BlockManager
from mm_infer.engine.scheduling.routing_rows import RoutingRows
from mm_infer.engine.scheduling.scheduler import Scheduler
from mm_infer.engine.scheduling.sequence import Sequence, SequenceGroup, SequenceStatus
from mm_infer.prompt.placeholders import PlaceholderRange


def group(rid: str, tokens: list[int], media: list[tuple[int, int, str]] = (), n: int = 1,
          max_tokens: int = 8) -> SequenceGroup:
    ranges = [PlaceholderRange(off, length, "image", h, i) for i, (off, length, h) in enumerate(media)]
    request = SimpleNamespace(placeholders=ranges, item_patches=[4 * r.length for r in ranges])  # no tensors here
    g = SequenceGroup(rid, SamplingParams(n=n, max_tokens=max_tokens), request)
    g.seqs = [Sequence(g, tokens, i) for i in range(n)]
    return g


def fake_routing(out, rows: int = 2) -> np.ndarray:
    """The step's routing as a model would record it: here each row a function of the token it is for."""
    ids = [t for c in out.chunks for t in c.seq.token_ids[c.start:c.end]]
    return np.repeat(np.asarray(ids, dtype=np.uint8)[:, None, None], rows, axis=1)  # [N, rows, 1]


def check_routing(seq: Sequence) -> None:
    """A sample's rows are its own tokens' (fake_routing), whatever hits, preemptions and batches it went through."""
    n = seq.num_computed_tokens
    want = np.asarray(seq.token_ids[:n], dtype=np.uint8)
    assert seq.routing.length >= n and np.array_equal(seq.routing.rows(0, n)[:, 0, 0], want), seq.seq_id


def simulate(sched: Scheduler, groups: list[SequenceGroup], rng: random.Random, abort_p: float,
             routing: bool = False) -> int:
    """Drive the scheduler like the engine does; returns steps taken. Checks invariants every step (with routing:
    each sample's R3 rows too)."""
    live = [s for g in groups for s in g.seqs]
    for s in live:
        s.routing = RoutingRows() if routing else None
        sched.add(s)
    steps = 0
    while sched.has_unfinished():
        steps += 1
        assert steps < 2000, "scheduler made no progress"
        out = sched.schedule()
        seen = [c.seq.seq_id for c in out.chunks]
        assert len(seen) == len(set(seen)), "a sequence scheduled twice in one step"
        assert out.num_tokens <= sched.config.max_num_batched_tokens
        for c in out.chunks:
            assert c.start == c.seq.num_computed_tokens and c.end <= len(c.seq)
            assert len(c.seq.block_table) * sched.block_manager.block_size >= c.end
        sched.update(out, fake_routing(out) if routing else None)
        for c in out.chunks:
            if routing:
                check_routing(c.seq)
            if c.samples and not c.seq.is_finished:
                c.seq.token_ids.append(rng.randrange(100))
                if c.seq.num_output_tokens >= c.seq.params.max_tokens:
                    sched.finish(c.seq, "length")
        if rng.random() < abort_p:
            victims = [s for s in live if not s.is_finished]
            if victims:
                sched.finish(rng.choice(victims), "abort")
        sched.block_manager.check_invariants(s for s in live if not s.is_finished)
    bm = sched.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not bm.used_ids
    assert all(s.is_finished for s in live)
    return steps


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), num_blocks=st.integers(8, 24), budget=st.integers(4, 64),
       abort_p=st.sampled_from([0.0, 0.1]), caching=st.booleans(), routing=st.booleans())
def test_random_traffic_keeps_block_invariants(seed, num_blocks, budget, abort_p, caching, routing):
    rng = random.Random(seed)
    bm = BlockManager(num_blocks, 4, enable_prefix_caching=caching)
    sched = Scheduler(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=budget), bm)
    shared = [rng.randrange(100) for _ in range(12)]
    groups = []
    for i in range(rng.randint(1, 8)):
        tokens = (shared if rng.random() < 0.5 else []) + [rng.randrange(100) for _ in range(rng.randint(1, 10))]
        media = [(len(tokens) - 1, 1, f"img{rng.randrange(2)}")] if rng.random() < 0.3 else []
        groups.append(group(f"r{i}", tokens, media, n=rng.randint(1, 3), max_tokens=rng.randint(1, 8)))
    simulate(sched, groups, rng, abort_p, routing)


def test_cached_routing_lives_and_dies_with_its_block():
    # catches: a block's R3 rows outliving its hash (a later hit would return another prompt's routing), or a
    # hit on a block cached without rows
    bm = BlockManager(4, 4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), bm)
    first = group("a", list(range(9)), max_tokens=1)
    simulate(sched, [first], random.Random(0), 0.0, routing=True)
    cached = [b for b in bm.blocks if b.hash is not None]
    assert len(cached) == 2 and all(b.routing is not None and b.routing.shape == (4, 2, 1) for b in cached)
    hit = group("b", list(range(9)), max_tokens=1).seqs[0]
    hit.routing = RoutingRows()
    assert bm.match_prefix(hit) == 8 and np.array_equal(hit.routing.rows(0, 8)[:, 0, 0], np.arange(8))
    bm.free(hit)
    without = group("c", list(range(9)), max_tokens=1).seqs[0]
    without.routing = RoutingRows()
    cached[0].routing = None  # as if cached by a run that recorded none
    assert bm.match_prefix(without) == 0, "a hit must bring its routing"
    bm.free(without)
    other = group("d", [50] * 16).seqs[0]
    bm.allocate(other, 16)  # takes every free block, evicting both hashes
    assert all(b.hash is None and b.routing is None for b in bm.blocks)
    bm.free(other)
    simulate(sched, [group("e", list(range(9)), max_tokens=1)], random.Random(0), 0.0, routing=True)
    bm.reset_prefix_cache()
    assert all(b.routing is None for b in bm.blocks)


def test_tiny_pool_forces_preemption_and_recovers():
    bm = BlockManager(10, 4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), bm)
    groups = [group(f"r{i}", list(range(i, i + 9)), max_tokens=20) for i in range(4)]
    simulate(sched, groups, random.Random(0), abort_p=0.0)
    assert sched.num_preemptions > 0
    assert all(s.num_output_tokens == 20 for g in groups for s in g.seqs)


def test_a_long_prompt_prefills_at_most_the_threshold_per_step_beside_decodes():
    # without the threshold, a 300-token prompt takes the whole 256-token budget in one step, and a decoding
    # request's next token waits behind that step (issue 32: other requests waited 6-12 s behind a 16k prompt)
    bm = BlockManager(200, 4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=256, long_prefill_token_threshold=32), bm)
    short, long = group("short", list(range(5)), max_tokens=20), group("long", list(range(1000, 1300)), max_tokens=2)
    sched.add(short.seqs[0])
    sched.update(first := sched.schedule())
    assert [c.end - c.start for c in first.chunks] == [5]
    short.seqs[0].token_ids.append(1)
    sched.add(long.seqs[0])
    chunks = []
    while long.seqs[0].num_computed_tokens < 300:
        out = sched.schedule()
        by_id = {c.seq.group.request_id: c.end - c.start for c in out.chunks}
        assert by_id["short"] == 1  # the decode runs every step the long prompt prefills
        chunks.append(by_id["long"])
        sched.update(out)
        for c in out.chunks:
            if c.samples:
                c.seq.token_ids.append(1)
    assert chunks == [32] * 9 + [12]
    assert Scheduler(SchedulerConfig(max_num_batched_tokens=256), BlockManager(200, 4)).config \
        .long_prefill_token_threshold == 0  # vLLM's default: off


def test_prefix_hits_never_cross_media():
    bm = BlockManager(64, 4)
    tokens = list(range(8)) + [7] * 8 + list(range(30, 38))  # media at [8, 16)
    first = group("a", tokens, [(8, 8, "cat")])
    other_image = group("b", tokens, [(8, 8, "dog")])
    same_image = group("c", tokens, [(8, 8, "cat")])
    sched = Scheduler(SchedulerConfig(), bm)
    sched.add(first.seqs[0])
    out = sched.schedule()
    sched.update(out)
    assert bm.match_prefix(other_image.seqs[0]) == 8  # the text before the image only
    assert bm.match_prefix(same_image.seqs[0]) == 20  # all full blocks, one token left to compute
    assert bm.blocks[other_image.seqs[0].block_table[-1]].hash is not None
    bm.check_invariants([first.seqs[0], other_image.seqs[0], same_image.seqs[0]])


def test_media_offset_inside_block_changes_hash():
    a = group("a", [1, 2, 3, 4], [(1, 2, "x")]).seqs[0]
    b = group("b", [1, 2, 3, 4], [(1, 2, "y")]).seqs[0]
    c = group("c", [1, 2, 3, 4], []).seqs[0]
    assert len({a.block_hash(0, 4), b.block_hash(0, 4), c.block_hash(0, 4)}) == 3


def test_n_samples_wait_for_sibling_prefill_then_hit():
    bm = BlockManager(64, 4)
    sched = Scheduler(SchedulerConfig(), bm)
    g = group("g", list(range(18)), n=3, max_tokens=2)
    for s in g.seqs:
        sched.add(s)
    out = sched.schedule()
    assert [c.seq.index for c in out.chunks] == [0]  # siblings wait for the shared prompt
    sched.update(out)
    out.chunks[0].seq.token_ids.append(5)
    out = sched.schedule()
    assert sorted(c.seq.index for c in out.chunks) == [0, 1, 2]
    assert [c.num_tokens for c in out.chunks] == [1, 2, 2]  # 16 of 18 prompt tokens were cache hits
    assert bm.stats.hits == 32
    shared = set(g.seqs[1].block_table[:4]) & set(g.seqs[2].block_table[:4]) & set(g.seqs[0].block_table[:4])
    assert len(shared) == 4
    bm.check_invariants(g.seqs)


def test_encoder_budget_clips_chunk_before_item():
    bm = BlockManager(64, 4)
    sched = Scheduler(SchedulerConfig(max_encoder_tokens_per_step=40), bm)
    a = group("a", list(range(4)) + [9] * 8 + [1], [(4, 8, "big")])  # 32 patches
    b = group("b", list(range(3)) + [9] * 8 + [1], [(3, 8, "other")])  # 32 more: over budget this step
    sched.add(a.seqs[0])
    sched.add(b.seqs[0])
    out = sched.schedule()
    assert [(c.seq.group.request_id, c.num_tokens) for c in out.chunks] == [("a", 13), ("b", 3)]
    assert b.seqs[0].status is SequenceStatus.RUNNING
