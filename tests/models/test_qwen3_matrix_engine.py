"""Engine features on tiny Qwen3-VL (dense and MoE), float32 CPU: prefix + encoder caches, n > 1 with seeds,
logprobs against a teacher-forced HF forward, and batch_invariant=True (alone == inside a mixed batch, bit for bit)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from qwen3_cases import QWEN3, chat_prompt, hf_completion_logprobs

from mm_infer import LLM, SamplingParams


@pytest.fixture(scope="module", params=sorted(QWEN3))
def fresh(request) -> Iterator[tuple[str, callable]]:
    """(kind, make): make(**options) builds an LLM on that checkpoint (one CPU thread: the box is shared).

    batch_invariant=True throughout: a prefix-cache hit computes fewer rows than a cold prefill, and only this mode
    promises the same bits whatever the row count (without it they differ by ~1e-6)."""
    threads = torch.get_num_threads()
    yield request.param, lambda **kw: LLM(str(QWEN3[request.param]), cpu_threads=1, num_kv_blocks=256,
                                          batch_invariant=True, **kw)
    torch.set_num_threads(threads)


def _same(a, b) -> None:
    """Two CompletionOutputs carry the same tokens and bit-identical logprobs."""
    assert a.token_ids == b.token_ids
    assert a.logprobs == b.logprobs, max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True))


def test_repeated_image_prompt_hits_prefix_and_encoder_caches(fresh):
    kind, make = fresh
    prompt = chat_prompt(image=["rgba.png"], text="Hi")  # 46 tokens, pads at 20..35: 4 past the cached blocks
    greedy = SamplingParams(temperature=0.0, max_tokens=6, logprobs=1)
    cold = make(enable_prefix_caching=False).generate([prompt], greedy, use_tqdm=False)[0].outputs[0]
    llm = make()
    first = llm.generate([prompt], greedy, use_tqdm=False)[0]
    ids = first.prompt_token_ids
    cached = (len(ids) - 1) // 16 * 16  # full blocks a repeat can reuse (the last prompt token is always computed)
    assert ids.index(3006) < cached < len(ids) - ids[::-1].index(3006), "the image must straddle the cached blocks"
    before = llm.engine.stats()
    again = llm.generate([prompt], greedy, use_tqdm=False)[0]
    after = llm.engine.stats()
    assert after["prefix_hit_tokens"] - before["prefix_hit_tokens"] == cached
    assert after["encoder_cache_hits"] > before["encoder_cache_hits"]  # the tail pads need the embeddings again
    assert after["encoder_calls"] == before["encoder_calls"] == 1
    assert again.prompt_token_ids == ids
    _same(first.outputs[0], cold)
    _same(again.outputs[0], cold)
    assert again.outputs[0].top_logprobs == first.outputs[0].top_logprobs


def test_n_samples_differ_reproduce_and_match_hf_logprobs(fresh):
    kind, make = fresh
    llm = make()
    prompt = chat_prompt(image=["photo.png"], text="What is it?")
    params = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=8, logprobs=2)
    a = llm.generate([prompt], params, use_tqdm=False)[0]
    b = llm.generate([prompt], params, use_tqdm=False)[0]
    other = llm.generate([prompt], SamplingParams(n=4, temperature=1.0, seed=8, max_tokens=8), use_tqdm=False)[0]
    assert [o.index for o in a.outputs] == [0, 1, 2, 3]
    assert len({tuple(o.token_ids) for o in a.outputs}) > 1, "samples under temperature 1 must differ"
    for x, y in zip(a.outputs, b.outputs, strict=True):
        _same(x, y)  # the second run also hit the prefix and encoder caches
    assert [o.token_ids for o in other.outputs] != [o.token_ids for o in a.outputs]
    request = llm.engine.prepare(prompt)
    worst = 0.0
    for out in a.outputs:
        assert len(out.logprobs) == len(out.token_ids) == len(out.top_logprobs) == 8
        for lp, top in zip(out.logprobs, out.top_logprobs, strict=True):
            assert len(top) >= 2 and max(top.values()) >= lp - 1e-6  # top-2 alternatives, best first
        ref = hf_completion_logprobs(kind, llm, request, out.token_ids)
        worst = max(worst, (torch.tensor(out.logprobs) - ref).abs().max().item())
    assert worst < 1e-4, f"{kind}: sampled-token logprobs differ from teacher-forced HF by {worst}"


def _mixed() -> tuple[list[dict], list[SamplingParams]]:
    prompts = [
        chat_prompt(text="def f(x): return x"),
        chat_prompt(image=["photo.png"]),
        chat_prompt(image=["tiny_9x13.png", "gray.png"], text="Compare them."),
        chat_prompt(video=["odd7_h264_2fps.mp4"]),
        chat_prompt(image=["strip_wide.png"], video=["pan_vp9_10fps.webm"], text="What moves?"),
        chat_prompt(image=["rgba.png"], text="Once upon a time " * 6),
        chat_prompt(text="count to ten"),
        chat_prompt(image=["half_round_42x126.png"]),
    ]
    params = [SamplingParams(temperature=0.0, max_tokens=6, logprobs=1) if i % 2 == 0 else
              SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=100 + i, max_tokens=6, logprobs=2)
              for i in range(len(prompts))]
    return prompts, params


def test_batch_invariant_alone_equals_inside_a_mixed_batch(fresh):
    kind, make = fresh
    llm = make(enable_prefix_caching=False, encoder_cache_items=1)  # everything recomputed
    prompts, params = _mixed()
    batched = llm.generate(prompts, params, use_tqdm=False)
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        alone = llm.generate([prompt], p, use_tqdm=False)[0]
        assert alone.prompt_token_ids == batched[i].prompt_token_ids
        assert alone.outputs[0].token_ids == batched[i].outputs[0].token_ids, f"{kind} request {i}: tokens differ"
        assert alone.outputs[0].logprobs == batched[i].outputs[0].logprobs, f"{kind} request {i}: logprobs differ"
        assert alone.outputs[0].top_logprobs == batched[i].outputs[0].top_logprobs
