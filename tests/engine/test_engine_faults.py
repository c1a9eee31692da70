"""A failure inside step() ends only the request it is blamed on; the loop serves everyone else exactly as before."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import torch
from engine_cases import CKPT

from mm_infer import SamplingParams
from mm_infer.engine.async_engine import AsyncEngine
from mm_infer.engine.engine import LLMEngine
from mm_infer.engine.errors import RequestFailedError

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


def _drain(engine: LLMEngine) -> dict:
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    return finals


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
