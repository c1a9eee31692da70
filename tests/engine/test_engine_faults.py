"""A failure inside step() ends only the request it is blamed on, and a slow reader only its own request; the loop
serves everyone else exactly as before."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
from engine_cases import CKPT
from engine_cases import drain as _drain

from mm_infer import SamplingParams
from mm_infer.engine.async_engine import AsyncEngine
from mm_infer.engine.engine import LLMEngine
from mm_infer.engine.errors import RequestFailedError
from mm_infer.engine.outputs.streams import Backpressure
from mm_infer.engine.sampling.params import RequestOutputKind

GREEDY = SamplingParams(max_tokens=12, min_tokens=12, temperature=0.0)


@pytest.fixture
def engine() -> Iterator[LLMEngine]:
    threads = torch.get_num_threads()
    yield LLMEngine.from_options(str(CKPT), num_kv_blocks=256, cpu_threads=1, batch_invariant=True)
    torch.set_num_threads(threads)


def _fail_when(engine: LLMEngine, bad_id: str, after_tokens: int = 0) -> None:
    """Make the model step raise whenever `bad_id` is in the batch with at least `after_tokens` generated."""
    real = engine.runner.run

    def run(chunks):
        if any(c.seq.group.request_id == bad_id and c.seq.num_output_tokens >= after_tokens for c in chunks):
            raise RuntimeError("injected fault")
        return real(chunks)

    engine.runner.run = run


def _solo(engine: LLMEngine, prompt: str) -> list[int]:
    engine.add_request("solo", prompt, GREEDY)
    return _drain(engine)["solo"].outputs[0].token_ids


@pytest.mark.parametrize("after_tokens", [0, 4], ids=["fails-in-prefill", "fails-in-decode"])
def test_a_fault_ends_only_the_request_it_is_blamed_on(engine, after_tokens):
    expected = _solo(engine, "good prompt")
    _fail_when(engine, "bad", after_tokens)
    engine.add_request("good", "good prompt", GREEDY)
    engine.step()  # good is in flight when bad arrives
    engine.add_request("bad", "bad prompt", SamplingParams(max_tokens=12, min_tokens=12, temperature=0.0, n=2))
    finals = _drain(engine)
    assert finals["good"].outputs[0].token_ids == expected and finals["good"].error is None
    bad = finals["bad"]
    assert bad.error is not None and bad.error.status == 500 and "injected fault" in bad.error.message
    assert [c.finish_reason for c in bad.outputs] == ["error", "error"]
    assert len(bad.outputs[0].token_ids) == after_tokens
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks and not engine.groups
    engine.add_request("after", "good prompt", GREEDY)  # the engine still serves
    assert _drain(engine)["after"].outputs[0].token_ids == expected


def test_a_batch_that_fails_as_a_whole_fails_its_requests_and_the_engine_goes_on(engine):
    real = engine.runner.run

    def run(chunks):
        if len({c.seq.group.request_id for c in chunks}) > 1:
            raise RuntimeError("only fails together")
        return real(chunks)

    engine.runner.run = run
    engine.add_request("a", "one", GREEDY)
    engine.add_request("b", "two", GREEDY)
    finals = _drain(engine)
    assert {rid: out.error.status for rid, out in finals.items()} == {"a": 500, "b": 500}
    engine.add_request("c", "three", GREEDY)
    assert _drain(engine)["c"].outputs[0].finish_reason == "length"


def test_non_finite_logits_from_sampling_params_fail_the_request_with_a_400(engine):
    """F14: repetition_penalty=1e-300 is 0 in float32, so logits / penalty is inf: never a pad token, a 400."""
    engine.add_request("good", "hello there", GREEDY)
    engine.add_request("nan", "hello there", SamplingParams(max_tokens=8, temperature=1.0, repetition_penalty=1e-300,
                                                            seed=1))
    finals = _drain(engine)
    assert finals["nan"].error.status == 400 and "repetition_penalty" in finals["nan"].error.message
    assert finals["nan"].outputs[0].token_ids == [] and finals["good"].error is None


def test_non_finite_model_logits_are_a_500_naming_the_model(engine):
    real = engine.runner.run

    def run(chunks):
        out = real(chunks)
        if out.sample_logits is not None and out.sample_logits.numel():
            with torch.inference_mode():
                out.sample_logits[0, 5] = float("nan")  # the first sampled row: the only request
        return out

    engine.runner.run = run
    engine.add_request("x", "hello", GREEDY)
    out = _drain(engine)["x"]
    assert out.error.status == 500 and "the model produced non-finite logits" in out.error.message


def test_async_engine_raises_for_the_failed_request_only(engine):
    _fail_when(engine, "bad")
    aengine = AsyncEngine(engine)

    async def main():
        async def final(rid: str, prompt: str):
            last = None
            async for out in aengine.generate(prompt, GREEDY, rid):
                last = out
            return last

        return await asyncio.gather(final("good", "good prompt"), final("bad", "bad prompt"),
                                    return_exceptions=True)

    try:
        good, bad = asyncio.run(main())
    finally:
        aengine.shutdown()
    assert good.outputs[0].finish_reason == "length"
    assert isinstance(bad, RequestFailedError) and bad.status == 500 and "injected fault" in str(bad)


def _reader(aengine: AsyncEngine, rid: str, params: SamplingParams):
    return aengine.generate("a slow reader", params, rid)


def test_a_slow_reader_holds_its_request_without_losing_a_token(engine):
    """F2: an unread stream grew memory without bound; now its request waits (KV kept) and resumes exactly."""
    params = SamplingParams(max_tokens=60, min_tokens=60, temperature=0.0)
    engine.add_request("ref", "a slow reader", params)
    expected = _drain(engine)["ref"].outputs[0].token_ids
    aengine = AsyncEngine(engine, Backpressure(high=4, low=2, stall_timeout_s=60))

    async def main():
        gen = _reader(aengine, "slow", replace(params, output_kind=RequestOutputKind.DELTA))
        ids = list((await gen.__anext__()).outputs[0].token_ids)
        deadline = time.monotonic() + 30
        while not engine.groups["slow"].held:  # the reader stopped: the engine holds the request
            assert time.monotonic() < deadline, "the request was never held"
            await asyncio.sleep(0.01)
        generated = len(engine.groups["slow"].seqs[0].output_token_ids)
        await asyncio.sleep(0.3)
        assert len(engine.groups["slow"].seqs[0].output_token_ids) == generated <= 1 + 4 + 1
        assert aengine.stalled_for() == 0.0  # a held request is not a stalled engine
        async for out in gen:  # reading again releases it
            ids += out.outputs[0].token_ids
        return ids

    try:
        assert asyncio.run(main()) == expected
    finally:
        aengine.shutdown()


def test_a_reader_that_stops_for_good_is_aborted_and_its_kv_freed(engine):
    aengine = AsyncEngine(engine, Backpressure(high=3, low=1, stall_timeout_s=0.3))
    params = SamplingParams(max_tokens=200, min_tokens=200, temperature=0.0, output_kind=RequestOutputKind.DELTA)

    async def main():
        gen = _reader(aengine, "gone", params)
        await gen.__anext__()
        deadline = time.monotonic() + 30
        while "gone" in engine.groups:
            assert time.monotonic() < deadline, "the stalled request was never aborted"
            await asyncio.sleep(0.05)
        reasons = [out.outputs[0].finish_reason async for out in gen]
        return reasons[-1]

    try:
        assert asyncio.run(main()) == "abort"
    finally:
        aengine.shutdown()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
