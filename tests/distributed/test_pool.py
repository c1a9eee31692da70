"""ReplicaPool on a local Ray with 2 replicas of the tiny model: exactness, affinity, fan-out, errors, aborts."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
import torch
from replica_cases import CKPT, COLOURS, OPTIONS, image_prompt, png, text_prompt
from safetensors.torch import load_file

from mm_infer.distributed import PoolConfig, ReplicaPool, generate_batch
from mm_infer.engine.control.ops import Freeze, ResetCaches, UpdateWeights
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.llm import LLM
from mm_infer.media import MediaError
from mm_infer.prompt.placeholders import PromptError


@pytest.fixture(scope="module")
def pool(local_ray: None) -> Iterator[ReplicaPool]:
    pool = ReplicaPool(PoolConfig(str(CKPT), 2, OPTIONS, health_interval_s=0.5))
    yield pool
    pool.shutdown()


@pytest.fixture(scope="module")
def local() -> LLM:
    return LLM(str(CKPT), **OPTIONS)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def final(pool: ReplicaPool, prompt: Any, params: SamplingParams, rid: str, key: str | None = None):
    last = None
    async for out in pool.generate(prompt, params, rid, key):
        last = out
    return last


def counters(pool: ReplicaPool) -> list[dict[str, Any]]:
    return sorted(pool.counters(), key=lambda c: c["index"])


def test_each_replica_runs_in_its_own_process_on_its_own_core(pool):
    infos = [slot.info for slot in pool.supervisor.slots]
    assert len({i["pid"] for i in infos}) == 2
    assert [i["cpus"] for i in infos] == [[c] for c in sorted(os.sched_getaffinity(0))[:2]]
    assert pool.facts.max_model_len == OPTIONS["max_model_len"] and pool.is_alive


def test_outputs_through_the_pool_equal_one_local_engine(pool, local):
    prompts = [image_prompt(png(c)) for c in COLOURS[:3]] + [text_prompt(f"count to {i}") for i in range(3)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)

    async def all_of_them():
        return await asyncio.gather(*(final(pool, p, params, f"eq-{i}") for i, p in enumerate(prompts)))

    outs = run(all_of_them())
    want = local.generate(prompts, params, use_tqdm=False)
    assert {o.extra["replica"] for o in outs} == {0, 1}, "the work was spread over both replicas"
    for got, ref in zip(outs, want, strict=True):
        assert got.prompt_token_ids == ref.prompt_token_ids
        assert got.outputs[0].token_ids == ref.outputs[0].token_ids
        assert got.outputs[0].logprobs == ref.outputs[0].logprobs, "same engine, same math: bit-equal logprobs"


def test_generate_batch_keeps_order_and_equals_llm_generate(pool, local):
    prompts = [image_prompt(png(c)) for c in COLOURS[3:]] + [text_prompt("batch text")]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = generate_batch(pool, prompts, params)
    want = local.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [w.outputs[0].token_ids for w in want]
    with pytest.raises(ValueError, match="affinity keys"):
        generate_batch(pool, prompts, params, affinity_keys=["only-one"])
    with pytest.raises(MediaError):  # prepared first: nothing was sent
        generate_batch(pool, [text_prompt("fine"), image_prompt(b"broken")], params)


def test_grpo_groups_stick_to_one_replica(pool):
    before = counters(pool)
    images = [png(c, size=84) for c in COLOURS[:4]]
    params = [SamplingParams(max_tokens=6, temperature=1.0, seed=s) for s in range(8)]
    hits_before = (pool.router.stats.keyed_repeat, pool.router.stats.affinity_hits)
    puts_before, media_hits_before = pool.media.puts, pool.media.hits

    async def groups():
        jobs = [final(pool, image_prompt(img), p, f"grpo-{g}-{s}") for g, img in enumerate(images)
                for s, p in enumerate(params)]
        return await asyncio.gather(*jobs)

    outs = run(groups())
    after = counters(pool)
    by_group = [{o.extra["replica"] for o in outs[g * 8:(g + 1) * 8]} for g in range(4)]
    assert all(len(r) == 1 for r in by_group), f"a group was split across replicas: {by_group}"
    assert {next(iter(r)) for r in by_group} == {0, 1}, "groups were spread over both replicas"
    new_keys = [{k: v - b["requests_by_key"].get(k, 0) for k, v in a["requests_by_key"].items()
                 if v > b["requests_by_key"].get(k, 0)} for a, b in zip(after, before, strict=True)]
    assert sum(len(k) for k in new_keys) == 4 and all(v == 8 for k in new_keys for v in k.values())
    assert not set(new_keys[0]) & set(new_keys[1]), "each media key was served by exactly one replica"
    calls = sum(a["encoder_calls"] - b["encoder_calls"] for a, b in zip(after, before, strict=True))
    assert calls == 4, f"one vision encoder call per distinct image, got {calls}"
    repeat = pool.router.stats.keyed_repeat - hits_before[0]
    hits = pool.router.stats.affinity_hits - hits_before[1]
    assert repeat == 28 and hits / repeat >= 0.95
    assert pool.media.puts - puts_before == 4, "each image's pixels entered the object store once"
    assert pool.media.hits - media_hits_before == 28


def test_an_explicit_affinity_key_beats_the_prompt(pool):
    params = SamplingParams(max_tokens=2)

    async def two():
        a = await final(pool, text_prompt("first topic"), params, "key-a", "session-42")
        b = await final(pool, text_prompt("another topic"), params, "key-b", "session-42")
        return a, b

    a, b = run(two())
    assert a.extra["replica"] == b.extra["replica"]


def test_bad_input_keeps_its_status_and_no_replica_goes_down(pool):
    restarts = [s.restarts for s in pool.supervisor.slots]
    params = SamplingParams(max_tokens=2)
    with pytest.raises(MediaError) as media:  # found while preparing, in the router process
        run(final(pool, image_prompt(b"not an image"), params, "bad-media"))
    assert media.value.status in (400, 415)
    with pytest.raises(PromptError, match="placeholder"):
        run(final(pool, {"prompt_token_ids": [5, 6, pool.preparer.placeholder_ids.image_pad_id]}, params, "bad-pads"))
    too_long = {"prompt_token_ids": [7] * (OPTIONS["max_model_len"] + 5)}
    with pytest.raises(PromptError, match="context length"):  # found inside the replica, unwrapped from Ray
        run(final(pool, too_long, params, "too-long"))
    assert [s.state for s in pool.supervisor.slots] == ["up", "up"]
    assert [s.restarts for s in pool.supervisor.slots] == restarts


def test_abort_reaches_the_replica_and_closing_a_stream_frees_it(pool):
    params = SamplingParams(max_tokens=400, ignore_eos=True)

    async def abort_one():
        stream = pool.generate(text_prompt("long story"), params, "to-abort")
        first = await stream.__anext__()
        pool.abort("to-abort")
        last = first
        async for out in stream:
            last = out
        return last

    last = run(abort_one())
    assert last.finished and last.outputs[0].finish_reason == "abort"
    assert len(last.outputs[0].token_ids) < 400

    async def walk_away():
        stream = pool.generate(text_prompt("another long story"), params, "walk-away")
        await stream.__anext__()
        await stream.aclose()

    run(walk_away())
    deadline = time.monotonic() + 20
    while any(ray.get(s.handle.ping.remote())["running"] for s in pool.supervisor.slots):
        assert time.monotonic() < deadline, "an abandoned request kept running on its replica"
        time.sleep(0.05)
    assert all(pool.router.load[i] == 0 for i in range(2))


def test_freeze_fans_out_and_thaw_finishes_the_work(pool):
    params = SamplingParams(max_tokens=4, ignore_eos=True)

    async def frozen_then_thawed():
        await pool.control(Freeze(True))
        pending = [asyncio.ensure_future(final(pool, text_prompt(f"frozen {i}"), params, f"fz-{i}"))
                   for i in range(4)]
        await asyncio.sleep(0.6)
        stuck = not any(t.done() for t in pending)
        states = [ray.get(s.handle.ping.remote())["frozen"] for s in pool.supervisor.slots]
        await pool.control(Freeze(False))
        return stuck, states, await asyncio.gather(*pending)

    stuck, states, outs = run(frozen_then_thawed())
    assert stuck and states == [True, True]
    assert all(len(o.outputs[0].token_ids) == 4 for o in outs)


def test_refit_fans_out_and_each_replica_matches_a_local_refit(pool, local):
    state = load_file(str(CKPT / "model.safetensors"))
    name = next(k for k in state if k.endswith("norm.weight") and "visual" not in k and "layers" not in k)
    bucket = [(name, state[name] * 0.5)]
    prompts = [text_prompt(f"refit check {i}") for i in range(4)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    try:
        run(pool.control(UpdateWeights(bucket, 7)))
        assert pool.weight_version == 7
        assert [ray.get(s.handle.ping.remote())["weight_version"] for s in pool.supervisor.slots] == [7, 7]
        local.update_weights(bucket, version=7)

        async def both():
            return await asyncio.gather(*(final(pool, p, params, f"rf-{i}") for i, p in enumerate(prompts)))

        outs = run(both())
        want = local.generate(prompts, params, use_tqdm=False)
        assert {o.extra["replica"] for o in outs} == {0, 1}
        assert all(o.extra["weight_version"] == 7 for o in outs)
        for got, ref in zip(outs, want, strict=True):
            assert got.outputs[0].token_ids == ref.outputs[0].token_ids
        run(pool.control(ResetCaches()))
    finally:
        original = [(name, state[name])]
        run(pool.control(UpdateWeights(original, 8)))
        local.update_weights(original, version=8)
    assert all(e.version == 8 for e in pool.supervisor.journal.since(-1)), "the overwritten refit was compacted"
    assert torch.equal(state[name], load_file(str(CKPT / "model.safetensors"))[name])


def test_a_request_abandoned_before_its_first_output_is_cancelled_on_the_replica(pool):
    params = SamplingParams(max_tokens=600, ignore_eos=True)

    async def abandon_then_retry():
        task = asyncio.ensure_future(final(pool, text_prompt("abandoned early"), params, "early-exit"))
        await asyncio.sleep(0.05)  # routed and sent, nothing back yet
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        deadline = time.monotonic() + 20
        while any(ray.get(s.handle.ping.remote())["running"] for s in pool.supervisor.slots):
            assert time.monotonic() < deadline, "the abandoned request kept running on its replica"
            await asyncio.sleep(0.05)
        return await final(pool, text_prompt("abandoned early"), SamplingParams(max_tokens=3), "early-exit")

    again = run(abandon_then_retry())
    assert len(again.outputs[0].token_ids) == 3, "the request id is free again on the replica"
    assert pool.router.load == [0, 0]


def test_a_refit_that_fails_on_the_replicas_is_forgotten_and_they_restart_on_the_old_weights(pool):
    version, restarts = pool.weight_version, [s.restarts for s in pool.supervisor.slots]
    entries = list(pool.supervisor.journal.since(-1))
    with pytest.raises(Exception, match="no_such.weight"):
        run(pool.control(UpdateWeights([("model.no_such.weight", torch.zeros(3))], version + 1)))
    assert pool.weight_version == version and pool.supervisor.journal.since(-1) == entries
    deadline = time.monotonic() + 120
    while [s.restarts for s in pool.supervisor.slots] != [r + 1 for r in restarts] or len(
            pool.supervisor.up_slots()) < 2:
        assert time.monotonic() < deadline, "the replicas were not restarted after the failed refit"
        time.sleep(0.2)
    assert [ray.get(s.handle.ping.remote())["weight_version"] for s in pool.supervisor.slots] == [version] * 2
