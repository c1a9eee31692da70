"""Heavy steps (media, long prompts) may run on more torch threads; a request's numbers stay the same."""

from __future__ import annotations

import torch
from engine_cases import CKPT, case

from mm_infer import LLM, SamplingParams
from mm_infer.engine.runner.batch_plan import BatchPlan
from mm_infer.engine.runner.step_threads import (
    HEAVY_STEP_TOKENS,
    StepThreads,
    checked_heavy_threads,
    thread_count_changes_numbers,
)

PROMPTS = [case([40, ("image", 1, 8, 8), 30], 1), case([HEAVY_STEP_TOKENS + 40], 2),
           case([20, ("video", 2, 8, 8), 10], 3), case([12], 4)]


def _outputs(llm: LLM) -> list[tuple]:
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=8, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs, o.outputs[0].top_logprobs, o.prompt_logprobs)
            for o in outs]


def test_heavy_steps_switch_threads_and_change_no_number():
    # catches: a thread count that changes GEMM or attention results (MKL splitting a dot product, a reduction
    # order per thread), or a switch that is never undone and leaves decode on the heavy setting
    one = LLM(str(CKPT), num_kv_blocks=256, cpu_threads=1)
    want = _outputs(one)
    two = LLM(str(CKPT), num_kv_blocks=256, cpu_threads=1, cpu_threads_heavy=2)
    seen: list[int] = []
    model = two.engine.runner.model
    forward = model.forward_hidden

    def recording(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return forward(*args, **kwargs)

    model.forward_hidden = recording
    got = _outputs(two)
    assert got == want
    assert 2 in seen and 1 in seen  # the prefill ran on 2 threads, the decode steps on 1
    assert torch.get_num_threads() == 1


def test_which_steps_are_heavy():
    def plan(tokens: int, media: bool = False) -> BatchPlan:
        p = BatchPlan([], token_ids=[0] * tokens)
        p.media = [object()] if media else []  # type: ignore[list-item]
        return p

    assert not StepThreads.is_heavy(plan(HEAVY_STEP_TOKENS - 1))
    assert StepThreads.is_heavy(plan(HEAVY_STEP_TOKENS))
    assert StepThreads.is_heavy(plan(5, media=True))
    torch.set_num_threads(1)
    with StepThreads(heavy=None).for_plan(plan(HEAVY_STEP_TOKENS)):
        assert torch.get_num_threads() == 1
    with StepThreads(heavy=2).for_plan(plan(3)):
        assert torch.get_num_threads() == 1
    with StepThreads(heavy=2).for_plan(plan(3, media=True)):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1


def test_batch_invariance_keeps_one_thread_setting():
    llm = LLM(str(CKPT), num_kv_blocks=64, cpu_threads=1, cpu_threads_heavy=2, batch_invariant=True)
    assert llm.engine.runner.threads.heavy is None


def test_mkl_runs_in_its_strict_reproducible_mode():
    # catches: mm_infer's import no longer asking MKL for thread-count-independent sgemm (heavy steps would then be
    # switched off on AVX-512 CPUs, or change numbers where the probe misses a shape)
    import os

    import mm_infer  # noqa: F401

    assert os.environ.get("MKL_CBWR", "").upper().endswith("STRICT")
    assert not thread_count_changes_numbers(1, 2)


def test_heavy_threads_refused_where_they_change_numbers(monkeypatch):
    from mm_infer.engine.runner import step_threads

    monkeypatch.setattr(step_threads, "thread_count_changes_numbers", lambda light, heavy: True)
    assert checked_heavy_threads(1, 2) is None  # would change bits: never switch
    assert checked_heavy_threads(1, None) is None and checked_heavy_threads(2, 2) == 2
    monkeypatch.setattr(step_threads, "thread_count_changes_numbers", lambda light, heavy: False)
    assert checked_heavy_threads(1, 2) == 2
