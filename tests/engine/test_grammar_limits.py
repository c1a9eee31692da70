"""Issue 32 (3): grammars compile on their own threads under a deadline and a size cap, into a cache bounded in
bytes; the in-process engine (AsyncEngine: the thread core and every replica) waits on its own grammar only."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace

import pytest
from engine_cases import CKPT

from mm_infer import SamplingParams
from mm_infer.engine.async_engine import AsyncEngine
from mm_infer.engine.engine import LLMEngine
from mm_infer.structured import StructuredOutputsParams as Spec
from mm_infer.structured import compiler as compiler_module
from mm_infer.structured.compiler import GrammarCompiler, GrammarError, hf_tokenizer, tokenizer_info

WAIT_S = 60.0


def schema(n: int, tag: str = "p") -> dict:
    return {"type": "object", "properties": {f"{tag}{i}": {"type": "string"} for i in range(n)},
            "required": [f"{tag}{i}" for i in range(n)]}


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine.from_options(str(CKPT), num_kv_blocks=256, max_model_len=1024, cpu_threads=1)


def test_the_grammar_cache_is_bounded_in_bytes(engine):
    # the bug: 64 entries whatever their size (~85 MB each for a large schema: 5.4 GB when full)
    hf = hf_tokenizer(engine.tokenizer, str(CKPT))
    info = tokenizer_info(hf, engine.runtime.vocab_size, list(engine.eos_ids))
    one = GrammarCompiler(info).compile(Spec(json=schema(8, "size")))
    budget = int(one.memory_size_bytes * 2.5)  # room for two grammars of that size, never three
    compiler = GrammarCompiler(info, cache_bytes=budget)
    for tag in "abcde":
        compiler.compile(Spec(json=schema(8, tag)))
        assert compiler.cached_bytes <= budget
    assert compiler.compilations == 5 and len(compiler._cache) == 2  # the two most recent, by bytes not by count
    assert compiler.lookup(Spec(json=schema(8, "e")).key()) is not None
    assert compiler.lookup(Spec(json=schema(8, "a")).key()) is None
    big = compiler.compile(Spec(json=schema(200, "big")))  # bigger than the whole budget: used, never kept
    assert big.memory_size_bytes > budget and compiler.cached_bytes <= budget
    assert compiler.lookup(Spec(json=schema(200, "big")).key()) is None


def test_a_schema_over_the_size_cap_is_refused_before_compiling(engine, monkeypatch):
    grammars = engine.grammars
    monkeypatch.setattr(grammars, "config", replace(grammars.config, max_grammar_bytes=4096))
    compiles = []
    monkeypatch.setattr(compiler_module.GrammarCompiler, "_compile", lambda self, spec: compiles.append(spec))
    with pytest.raises(GrammarError, match="over this server's limit of 4096 bytes") as e:
        engine.compile_grammar(SamplingParams(structured_outputs=Spec(json=schema(300))))
    assert e.value.status == 400 and not compiles


@pytest.fixture()
def gate(grammar_gate) -> threading.Event:
    return grammar_gate


def slow(tag: str) -> Spec:
    return Spec(json={"type": "object", "properties": {"slow": {"type": "integer"}, tag: {"type": "integer"}}})


async def final(engine: AsyncEngine, prompt: str, params: SamplingParams, rid: str):
    async for out in engine.generate(prompt, params, rid, stream=False):
        return out


def test_the_thread_core_waits_on_its_own_grammar_under_a_deadline(engine, gate, monkeypatch):
    # the bug: no deadline (the compile ran on the default executor until done, holding one of its threads)
    monkeypatch.setattr(engine.grammars, "config", replace(engine.grammars.config, grammar_timeout_s=0.5))
    front = AsyncEngine(engine)
    plain = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    async def go():
        waiting = asyncio.ensure_future(final(front, "json:", SamplingParams(
            max_tokens=8, structured_outputs=slow("thread")), "grammar"))
        innocent = await asyncio.wait_for(final(front, "hello there", plain, "innocent"), WAIT_S)
        assert not waiting.done() and not gate.is_set()  # it finished while the grammar was still compiling
        with pytest.raises(GrammarError, match="did not compile within 0.5s") as e:
            await asyncio.wait_for(waiting, WAIT_S / 2)
        return innocent, e.value

    try:
        innocent, error = asyncio.run(go())
    finally:
        front.shutdown()
    assert error.status == 400 and innocent.outputs[0].finish_reason == "length"
    assert not gate.is_set() and "grammar" not in engine.groups


def test_requests_for_one_spec_share_one_compile(engine, gate):
    spec = slow("shared")
    first, second = engine.grammars.submit(spec), engine.grammars.submit(spec)
    assert first is second and not first.done()
    gate.set()
    assert first.result(WAIT_S) is engine.grammars.submit(spec).result(0)  # then a cache hit
