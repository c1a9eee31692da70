"""Prefix cache across n samples, encoder cache reuse and eviction, preemption and aborts on a tiny pool."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from engine_cases import CKPT, case

from mm_infer import LLM, SamplingParams
from mm_infer.engine.scheduling.encoder_cache import EncoderCache
from mm_infer.prompt.placeholders import PromptError


@pytest.fixture(scope="module")
def fresh() -> Iterator[callable]:
    threads = torch.get_num_threads()
    yield lambda **kw: LLM(str(CKPT), cpu_threads=1, batch_invariant=True, **kw)
    torch.set_num_threads(threads)


def test_grpo_group_shares_prompt_kv_and_encodes_once(fresh):
    llm = fresh(num_kv_blocks=256)
    prompt = case([20, ("image", 1, 8, 8), 30], seed=1)  # 16 image tokens, 68 prompt tokens
    out = llm.generate([prompt], SamplingParams(n=8, temperature=1.0, seed=3, max_tokens=6), use_tqdm=False)[0]
    stats = llm.engine.stats()
    assert stats["encoder_calls"] == 1
    full = (len(out.prompt_token_ids) - 1) // 16 * 16
    assert stats["prefix_hit_tokens"] == 7 * full  # every sample after the first reuses the prompt blocks
    assert len(out.outputs) == 8 and len({tuple(o.token_ids) for o in out.outputs}) > 1


def test_cache_hits_give_the_same_logprobs_as_cold_compute(fresh):
    llm = fresh(num_kv_blocks=256)
    prompt = case([9, ("image", 1, 6, 8), 25, ("video", 2, 4, 4), 5], seed=2)
    greedy = SamplingParams(n=4, temperature=0.0, max_tokens=8)
    warm = llm.generate([prompt], greedy, use_tqdm=False)[0]
    cold = fresh(num_kv_blocks=256, enable_prefix_caching=False, encoder_cache_items=1).generate(
        [prompt], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)[0].outputs[0]
    assert llm.engine.stats()["prefix_hit_tokens"] > 0
    for o in warm.outputs:
        assert o.token_ids == cold.token_ids
        assert max(abs(a - b) for a, b in zip(o.logprobs, cold.logprobs, strict=True)) <= 1e-6


def test_encoder_runs_once_per_distinct_image(fresh):
    llm = fresh(num_kv_blocks=512)
    a, b = case([3, ("image", 1, 4, 4), 3], seed=10), case([3, ("image", 1, 6, 4), 3], seed=11)
    img_a, img_b = a["multi_modal_data"]["image"], b["multi_modal_data"]["image"]
    prompts = [
        {"prompt_token_ids": [5, 3003, 3006, 3004, 6], "multi_modal_data": {"image": img_a}},
        {"prompt_token_ids": [7, 7, 3003, 3006, 3004], "multi_modal_data": {"image": img_b}},
        {"prompt_token_ids": [8, 3003, 3006, 3004, 1, 3003, 3006, 3004],
         "multi_modal_data": {"image": type(img_a).concat([img_b, img_a])}},
    ]
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
    assert llm.engine.stats()["encoder_calls"] == 2


def test_encoder_cache_lru_and_weight_version():
    cache = EncoderCache(max_items=2)
    cache.put("a", torch.zeros(1))
    cache.put("b", torch.ones(1))
    assert cache.get("a") is not None  # a is now most recent
    cache.put("c", torch.ones(2))
    assert "b" not in cache and "a" in cache and "c" in cache and cache.stats.evictions == 1
    cache.set_weight_version(1)
    assert "a" not in cache and cache.get("a") is None and len(cache) == 0


def test_preemption_on_tiny_pool_keeps_results_and_accounting(fresh):
    prompts = [case([10 + 7 * i, ("image", 1, 4, 8), 5], seed=20 + i) for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    roomy = fresh(num_kv_blocks=512).generate(prompts, params, use_tqdm=False)
    tight = fresh(num_kv_blocks=12, max_num_batched_tokens=256)
    outs = tight.generate(prompts, params, use_tqdm=False)
    engine = tight.engine
    assert engine.stats()["preemptions"] > 0
    for a, b in zip(roomy, outs, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert max(abs(x - y) for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True)) <= 1e-5
    engine.block_manager.check_invariants([])
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_abort_reports_partial_output_and_frees_blocks(fresh):
    llm = fresh(num_kv_blocks=24)
    engine = llm.engine
    for i in range(4):
        engine.add_request(f"r{i}", case([12, ("image", 1, 4, 4), 4], seed=30 + i),
                           SamplingParams(n=2, temperature=1.0, seed=i, max_tokens=40))
    finished = {}
    for _ in range(6):
        for out in engine.step():
            finished[out.request_id] = out
        engine.block_manager.check_invariants(engine.scheduler.live_sequences())
    aborted = engine.abort("r1")
    assert aborted.finished and all(o.finish_reason == "abort" for o in aborted.outputs)
    assert all(len(o.logprobs) == len(o.token_ids) for o in aborted.outputs)
    assert any(o.token_ids for o in aborted.outputs)
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        engine.block_manager.check_invariants(engine.scheduler.live_sequences())
        if "r2" in engine.groups and not engine.groups["r2"].seqs[0].in_prompt:
            engine.abort("r2")
    assert finished["r1"].outputs[0].finish_reason == "abort"  # reported once more by step(), still "abort"
    assert all(o.finish_reason == "length" for o in finished["r0"].outputs + finished["r3"].outputs)
    assert engine.abort("r0") is None  # finished requests cannot be aborted
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_prompt_larger_than_pool_is_rejected(fresh):
    with pytest.raises(PromptError, match="context length is 32"):
        fresh(num_kv_blocks=2).generate([case([40], seed=1)], use_tqdm=False)


def test_weight_update_drops_encoder_and_prefix_caches(fresh):
    llm = fresh(num_kv_blocks=128)
    prompt = case([20, ("image", 1, 4, 4), 20], seed=4)
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    before = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0]
    state = {f"model.language_model.{k}": v for k, v in llm.engine.model.language.state_dict().items()}
    state["model.language_model.norm.weight"] = state["model.language_model.norm.weight"] * 2
    llm.update_weights(state.items(), version=1)
    assert len(llm.engine.encoder_cache) == 0 and not llm.engine.block_manager.hash_to_block
    after = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0]
    assert llm.engine.stats()["encoder_calls"] == 2
    assert after.logprobs != before.logprobs


def test_chunked_prefill_and_encoder_budget_match_unchunked(fresh):
    prompts = [case([7, ("image", 1, 8, 12), 9, ("video", 2, 8, 8), 13], seed=90 + i) for i in range(3)]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    whole = fresh(num_kv_blocks=256, enable_prefix_caching=False).generate(prompts, params, use_tqdm=False)
    tiny = fresh(num_kv_blocks=256, enable_prefix_caching=False, max_num_batched_tokens=13,
                 max_encoder_tokens_per_step=100)  # chunk boundaries fall inside images and videos
    chunked = tiny.generate(prompts, params, use_tqdm=False)
    assert tiny.engine.stats()["encoder_calls"] == 6
    for a, b in zip(whole, chunked, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert max(abs(x - y) for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True)) <= 1e-5


def test_context_is_capped_by_the_pool_so_one_sequence_always_fits(fresh):
    llm = fresh(num_kv_blocks=4)  # 64 tokens in all
    outs = llm.generate([case([20], seed=5), case([30], seed=6)],
                        SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [44, 34]
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    assert llm.engine.stats()["preemptions"] > 0
