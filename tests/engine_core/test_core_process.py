"""The engine core in its own process: same outputs as in-process, errors per request, aborts, and faults."""

from __future__ import annotations

import asyncio
import glob
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from mm_infer import LLM, SamplingParams
from mm_infer.distributed.errors import ReplicaUnavailableError
from mm_infer.engine.control.ops import Freeze, Sleep, UpdateWeights
from mm_infer.engine.sampling.params import RequestOutputKind
from mm_infer.engine_core import CoreProcessBackend, CoreStartupError
from mm_infer.engine_core.core_client import core_options
from mm_infer.prompt.placeholders import PromptError

ORIGINAL_ENV = dict(os.environ)
REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "assets" / "models" / "tiny-qwen2-vl"
IMAGE = REPO / "assets" / "media" / "images"
# one thread on both sides: the same reduction order, so the same numbers bit for bit
OPTIONS: dict[str, Any] = {"max_model_len": 512, "num_kv_blocks": 128, "max_num_seqs": 8, "cpu_threads": 1}


def greedy(n: int = 12, **extra: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True, **extra)


def image_prompt() -> dict[str, Any]:
    path = sorted(IMAGE.glob("*.png"))[0]
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is it"}]}],
            "multi_modal_data": {"image": [path.read_bytes()]}, "mm_processor_kwargs": {"max_pixels": 64 * 64 * 4}}


@pytest.fixture(scope="module")
def backend() -> Iterator[CoreProcessBackend]:
    core = CoreProcessBackend(str(CKPT), OPTIONS)
    yield core
    core.shutdown()


@pytest.fixture(scope="module")
def local() -> LLM:
    return LLM(str(CKPT), **OPTIONS)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def collect(backend: CoreProcessBackend, prompt: Any, params: SamplingParams, rid: str,
                  stream: bool = True) -> list[Any]:
    return [out async for out in backend.generate(prompt, params, rid, stream=stream)]


def test_greedy_ids_and_logprobs_equal_the_in_process_engine(backend, local):
    prompts = [{"prompt": "the cat sat on"}, image_prompt()]
    want = [local.generate([p], greedy(), use_tqdm=False)[0] for p in prompts]  # alone: batches change numerics
    for i, (prompt, ref) in enumerate(zip(prompts, want, strict=True)):
        final = run(collect(backend, prompt, greedy(), f"eq-{i}", stream=False))[-1]
        assert final.finished and final.outputs[0].token_ids == ref.outputs[0].token_ids
        assert final.outputs[0].logprobs == ref.outputs[0].logprobs  # bit for bit: same engine, same process rules
        assert final.prompt_token_ids == ref.prompt_token_ids  # restored on this side from the prepared request


def test_streams_of_each_output_kind_end_in_the_same_whole_output(backend):
    outs = {}
    for kind in (RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE):
        outs[kind] = run(collect(backend, {"prompt": "one two three"}, greedy(8, output_kind=kind), f"k-{kind.name}"))
    deltas = outs[RequestOutputKind.DELTA]
    cumulative = outs[RequestOutputKind.CUMULATIVE]
    assert all(d.outputs[0].token_ids for d in deltas)  # one token each, or more merged when the reader lagged
    joined = [t for d in deltas for t in d.outputs[0].token_ids]
    assert len(joined) == 8
    lengths = [len(c.outputs[0].token_ids) for c in cumulative]  # whole output each time, growing
    assert lengths == sorted(set(lengths)) and lengths[-1] == 8
    assert cumulative[-1].outputs[0].token_ids == joined
    assert cumulative[-1].outputs[0].text == "".join(d.outputs[0].text for d in deltas)


def test_prompt_logprobs_reach_every_output_though_sent_once(backend, local):
    params = greedy(4, prompt_logprobs=1, output_kind=RequestOutputKind.CUMULATIVE)
    ref = local.generate([{"prompt": "a b c d"}], params, use_tqdm=False)[0]
    outs = run(collect(backend, {"prompt": "a b c d"}, params, "plp"))
    assert all(o.prompt_logprobs == ref.prompt_logprobs for o in outs)
    assert ref.prompt_logprobs is not None and ref.prompt_logprobs[1] is not None


def test_a_bad_request_fails_alone_while_others_run(backend):
    async def both() -> tuple[Any, Any]:
        good = asyncio.ensure_future(collect(backend, {"prompt": "hello"}, greedy(16), "good"))
        await asyncio.sleep(0.05)
        bad = await asyncio.gather(collect(backend, {"prompt_token_ids": [5] * 600}, greedy(), "bad"),
                                   return_exceptions=True)
        return await good, bad[0]

    good, bad = run(both())
    assert isinstance(bad, PromptError) and bad.status == 400 and "context length" in str(bad)
    assert good[-1].finished and len(good[-1].outputs[0].token_ids) == 16


def test_closing_the_stream_aborts_the_request_in_the_core(backend):
    async def close_early() -> None:
        agen = backend.generate({"prompt": "count"}, greedy(200), "early")
        async for _ in agen:
            break
        await agen.aclose()

    run(close_early())
    run(collect(backend, {"prompt": "x"}, greedy(2), "flush"))  # a step after the abort reports it
    stats = run(backend._call("stats"))  # a reply comes after every output sent before it
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
    assert stats["free_blocks"] == stats["num_blocks"]


def test_media_travels_in_shared_memory_files_that_are_removed(backend):
    before = set(glob.glob("/dev/shm/mm-infer-core-*"))
    final = run(collect(backend, image_prompt(), greedy(3), "shm", stream=False))[-1]
    assert final.finished
    assert set(glob.glob("/dev/shm/mm-infer-core-*")) <= before


def test_the_core_runs_with_the_threads_given_and_openmp_workers_that_sleep(backend):
    assert backend.client.info["cpu_threads"] == 1  # OPTIONS gives 1
    assert backend.client.info["omp_wait_policy"] == os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    assert os.environ.get("OMP_WAIT_POLICY") != "PASSIVE" or "OMP_WAIT_POLICY" in ORIGINAL_ENV  # set for the child only
    cores = len(os.sched_getaffinity(0))
    if "OMP_NUM_THREADS" not in os.environ:
        assert core_options({})["cpu_threads"] == max(1, cores - 1)  # one core left to the server process
        assert core_options({})["cpu_threads_heavy"] == cores  # but an encode or a long prefill takes them all
        assert core_options({"cpu_threads_heavy": 1})["cpu_threads_heavy"] == 1
    assert core_options({"cpu_threads": 3}) == {"cpu_threads": 3}


def test_an_engine_side_error_in_a_call_reaches_the_caller(backend):
    with pytest.raises(RuntimeError, match="planted"):
        run(backend._call("raise", "planted"))


# --- faults: each test kills the core; the backend restarts it ------------------------------------------------

def wait_up(backend: CoreProcessBackend, old_pid: int | None, timeout_s: float = 120.0) -> None:
    async def poll() -> None:
        for _ in range(int(timeout_s / 0.1)):
            if backend.is_alive and backend.pid != old_pid:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"the core was not restarted within {timeout_s:g} s ({backend.last_failure})")

    run(poll())


def test_killed_mid_stream_fails_the_stream_with_a_503_naming_it_then_restarts(backend):
    pid = backend.pid

    async def stream_then_kill() -> list[Any]:
        got = []
        with pytest.raises(ReplicaUnavailableError) as info:
            async for out in backend.generate({"prompt": "long"}, greedy(400), "doomed"):
                got.append(out)
                if len(got) == 3:
                    backend.kill_core()
        assert info.value.status == 503
        assert f"pid {pid}" in str(info.value) and "SIGKILL" in str(info.value) and "'doomed'" in str(info.value)
        return got

    assert len(run(stream_then_kill())) >= 3
    with pytest.raises(ReplicaUnavailableError, match="restarting|down"):
        run(collect(backend, {"prompt": "too soon"}, greedy(2), "soon"))
    wait_up(backend, pid)
    assert backend.restarts >= 1
    assert run(collect(backend, {"prompt": "again"}, greedy(3), "again"))[-1].finished


def test_killed_while_idle_is_noticed_and_restarted(backend):
    pid = backend.pid
    os.kill(pid, 9)
    wait_up(backend, pid)
    assert run(collect(backend, {"prompt": "after"}, greedy(3), "after-idle"))[-1].finished


def test_a_refit_and_a_pause_are_replayed_into_the_restarted_core(backend):
    prompt = {"prompt": "the weights changed"}
    before = run(collect(backend, prompt, greedy(6), "pre-refit", stream=False))[-1].outputs[0].token_ids
    name, param = next((n, p) for n, p in backend.reference_model.named_parameters() if n.endswith("lm_head.weight"))
    weight = torch.randn(param.shape, generator=torch.Generator().manual_seed(3))
    run(backend.control(UpdateWeights([(name, weight)], 7)))
    refit = run(collect(backend, prompt, greedy(6), "post-refit", stream=False))[-1].outputs[0].token_ids
    assert refit != before  # the refit changes the answer, so a restart that lost it would show
    run(backend.control(Freeze(True)))
    pid = backend.pid
    backend.kill_core()
    wait_up(backend, pid)
    assert backend.weight_version == 7 and backend.client.stats.get("weight_version", 7) == 7

    async def frozen_then_thawed() -> list[int]:
        task = asyncio.ensure_future(collect(backend, prompt, greedy(6), "replayed", stream=False))
        await asyncio.sleep(1.0)
        assert not task.done()  # still paused after the restart
        await backend.control(Freeze(False))
        return (await task)[-1].outputs[0].token_ids

    assert run(frozen_then_thawed()) == refit


def test_a_core_that_died_asleep_comes_back_awake_and_says_so(backend):
    # the bug: the backend kept the dead core's sleep state, so every request got 503 until a /wake_up
    run(backend.control(Sleep(1)))
    assert backend.sleep_state.reason() is not None
    pid = backend.pid
    backend.kill_core()
    wait_up(backend, pid)
    assert backend.sleep_state.reason() is None
    assert run(collect(backend, {"prompt": "awake"}, greedy(3), "after-restart", stream=False))[-1].outputs[0].token_ids


def test_a_core_that_cannot_load_its_engine_fails_startup_with_its_reason():
    # the options parse here, and the engine fails in the child (no CUDA on this machine): its error comes back
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    with pytest.raises(CoreStartupError, match="the engine core could not start: .*(CUDA|cuda)"):
        CoreProcessBackend(str(CKPT), {**OPTIONS, "device": "cuda"}, restart=False)
