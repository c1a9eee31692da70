"""Greedy ids equal HF generate and logprobs match a teacher-forced HF forward, with mixed concurrent prompts."""

from __future__ import annotations

import pytest
from engine_cases import CKPT, MIXED, case, expand, hf_greedy, hf_teacher_forced

from mm_infer import LLM, SamplingParams

MAX_NEW = 12


@pytest.fixture(scope="module", params=["batch_invariant", "static_decode"])
def mixed_run(request, llm):
    """Both decode paths: the length-bucketed one (batch_invariant) and the static-buffer one (the default)."""
    if request.param == "static_decode":
        llm = LLM(str(CKPT), num_kv_blocks=2048, max_num_batched_tokens=4096, cpu_threads=1)
    prompts = [case(parts, seed) for seed, parts in enumerate(MIXED)]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW), use_tqdm=False)
    graphs = llm.engine.runner.graphs
    assert (graphs is not None and len(graphs.buffers) > 0) == (request.param == "static_decode")
    return prompts, outs


def test_expanded_prompt_ids_returned(mixed_run):
    prompts, outs = mixed_run
    assert len(prompts) >= 20
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.prompt_token_ids == expand(prompt)


def test_greedy_ids_equal_hf_generate(mixed_run):
    prompts, outs = mixed_run
    for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        ours = out.outputs[0].token_ids
        ref = hf_greedy(prompt, MAX_NEW)
        assert ours == ref, f"prompt {i} ({MIXED[i]}): ours {ours} != HF {ref}"
        assert out.outputs[0].finish_reason in ("stop", "length")


def test_logprobs_match_teacher_forced_hf(mixed_run):
    prompts, outs = mixed_run
    worst = 0.0
    for prompt, out in zip(prompts, outs, strict=True):
        comp = out.outputs[0]
        assert len(comp.logprobs) == len(comp.token_ids)
        ref = hf_teacher_forced(prompt, comp.token_ids)
        worst = max(worst, max(abs(a - b) for a, b in zip(comp.logprobs, ref.tolist(), strict=True)))
    assert worst < 1e-4, worst
