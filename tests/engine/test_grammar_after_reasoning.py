"""Structured outputs under a reasoning parser (issue 34.3): the grammar starts after the reasoning end token, or at
token 0 when the prompt already closed the reasoning (vLLM's structured output manager with a reasoner)."""

from __future__ import annotations

import re

import pytest

from mm_infer import SamplingParams
from mm_infer.engine.sampling import batch as sampling_batch
from mm_infer.structured import StructuredOutputsParams as Spec
from mm_infer.structured.reasoning import reasoning_ended

PROMPT = list(range(200, 230))
DIGITS = "[0-9]{3}"
START = 100  # stands for <think>: any id works, the engine only compares ids


def close(a: list[float], b: list[float]) -> bool:
    """Logprobs of two runs of one prompt: the second may be a prefix-cache hit (its last prompt token computed on
    its own), so floats are held to the design's 1e-4, ids exactly."""
    return len(a) == len(b) and all(abs(x - y) <= 1e-4 for x, y in zip(a, b, strict=True))


def greedy(**kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 12, "temperature": 0.0, **kw})


@pytest.fixture(scope="module")
def free(llm):
    """The unconstrained greedy answer to PROMPT; its third token plays `</think>` (the model reaches it itself)."""
    out = llm.generate({"prompt_token_ids": PROMPT}, greedy(max_tokens=6), use_tqdm=False)[0].outputs[0]
    end = out.token_ids[2]
    assert end not in out.token_ids[:2] and START not in out.token_ids and START not in PROMPT
    return out, end


def thinking(end: int, regex: str = DIGITS) -> Spec:
    return Spec(regex=regex, reasoning_start_ids=(START,), reasoning_end_ids=(end,))


def test_the_last_reasoning_tag_decides():
    # catches: a prompt that ended an earlier think block but opened a new one counted as ended (vLLM scans back)
    assert reasoning_ended([1, START, 5, 9], [START], [9])
    assert not reasoning_ended([1, 9, 5, START, 7], [START], [9])
    assert not reasoning_ended([1, 2, 3], [START], [9]) and not reasoning_ended([], [START], [9])
    assert reasoning_ended([9], [], [9])


def test_the_model_reasons_freely_then_follows_the_grammar(llm, free):
    # catches: the grammar enforced from token 0 (no room to think), the end token fed to the grammar (a regex
    # rejects it: the request fails), or reasoning tokens masked (their logprobs would differ)
    out, end = free
    got = llm.generate({"prompt_token_ids": PROMPT}, greedy(structured_outputs=thinking(end)),
                       use_tqdm=False)[0].outputs[0]
    assert got.token_ids[:3] == out.token_ids[:3] and close(got.logprobs[:3], out.logprobs[:3])
    assert re.fullmatch(DIGITS, llm.engine.tokenizer.decode(got.token_ids[3:], skip_special_tokens=True)), got.token_ids
    assert got.finish_reason == "stop"
    plain = llm.generate({"prompt_token_ids": PROMPT}, greedy(structured_outputs=Spec(regex=DIGITS)),
                         use_tqdm=False)[0].outputs[0]
    assert re.fullmatch(DIGITS, plain.text)  # without reasoning ids: from token 0, as before


def test_a_forced_end_token_starts_the_grammar_in_every_sample(llm, free):
    # catches: n samples sharing one gate, or logit_bias beating the grammar once it applies
    _, end = free
    p = SamplingParams(n=3, max_tokens=12, temperature=1.0, seed=5, logit_bias={end: 100.0},
                       structured_outputs=thinking(end))
    outs = llm.generate({"prompt_token_ids": PROMPT}, p, use_tqdm=False)[0].outputs
    tok = llm.engine.tokenizer
    for o in outs:
        assert o.token_ids[0] == end and end not in o.token_ids[1:], o.token_ids
        assert re.fullmatch(DIGITS, tok.decode(o.token_ids[1:], skip_special_tokens=True)) and o.finish_reason == "stop"


def test_a_prompt_that_closed_its_reasoning_gets_the_grammar_from_token_zero(llm, free):
    # catches: a prompt ending `<think>..</think>` (enable_thinking=False) left unconstrained; a prompt whose last
    # tag opens a new think block constrained at once
    _, end = free
    closed = {"prompt_token_ids": PROMPT + [START, 250, end]}
    want = llm.generate(closed, greedy(structured_outputs=Spec(regex=DIGITS)), use_tqdm=False)[0].outputs[0]
    got = llm.generate(closed, greedy(structured_outputs=thinking(end)), use_tqdm=False)[0].outputs[0]
    assert re.fullmatch(DIGITS, got.text) and got.token_ids == want.token_ids and close(got.logprobs, want.logprobs)
    reopened = {"prompt_token_ids": PROMPT + [end, 250, START]}
    unconstrained = llm.generate(reopened, greedy(max_tokens=4), use_tqdm=False)[0].outputs[0]
    if end in unconstrained.token_ids:
        pytest.skip("the model ends its reasoning at once after this prompt")
    got = llm.generate(reopened, greedy(max_tokens=4, structured_outputs=thinking(end)), use_tqdm=False)[0].outputs[0]
    assert got.token_ids == unconstrained.token_ids and close(got.logprobs, unconstrained.logprobs)


def test_reasoning_rows_are_not_masked_in_a_mixed_batch(llm, free, monkeypatch):
    # catches: a reasoning row's mask filled from its grammar (or from a neighbour's), the gate shared between rows;
    # each request gives exactly what it gives alone (batch-invariant engine)
    out, end = free
    prompt = {"prompt_token_ids": PROMPT}
    ps = [greedy(structured_outputs=thinking(end)), greedy(structured_outputs=Spec(regex="[a-z ]{40}")), greedy()]
    steps: list[list[bool]] = []
    real = sampling_batch.SamplingBatch.build

    def spy(seqs, device, *store):
        batch = real(seqs, device, *store)
        steps.append([i in batch.grammar_rows for i in range(len(seqs))])
        return batch

    monkeypatch.setattr(sampling_batch.SamplingBatch, "build", staticmethod(spy))
    outs = llm.generate([prompt] * 3, ps, use_tqdm=False)
    assert steps[0] == [False, True, False] and [True, True, False] in steps
    monkeypatch.undo()
    for o, p in zip(outs, ps, strict=True):
        alone = llm.generate(prompt, p, use_tqdm=False)[0].outputs[0]
        assert o.outputs[0].token_ids == alone.token_ids and o.outputs[0].logprobs == alone.logprobs


def test_reasoning_ids_share_the_compiled_grammar(llm, free):
    # catches: the reasoning ids put in the grammar cache key (one compile per parser setting)
    _, end = free
    assert thinking(end).key() == Spec(regex=DIGITS).key()
    grammars = llm.engine.grammars
    grammars.compile(Spec(regex="[0-9]{5}"))
    before = grammars.compiler.compilations
    grammars.compile(thinking(end, "[0-9]{5}"))
    assert grammars.compiler.compilations == before


def test_reasoning_ids_are_checked():
    with pytest.raises(ValueError, match="reasoning_end_ids"):
        Spec(regex=DIGITS, reasoning_end_ids=("</think>",))
    assert Spec(regex=DIGITS, reasoning_end_ids=[7]).reasoning_end_ids == (7,)
    assert SamplingParams(structured_outputs={"regex": DIGITS, "reasoning_end_ids": [7]}).structured_outputs \
        .reasoning_end_ids == (7,)
