"""A request's tokens and logprobs do not depend on the batch; seeded sampling is reproducible."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from engine_cases import CKPT, MIXED, case

from mm_infer import LLM, SamplingParams
from mm_infer.models.half_gemm_path import cpu_features, forced_path


@pytest.fixture(scope="module")
def cold_llm() -> Iterator[LLM]:
    """No prefix or encoder reuse, so every run computes everything from scratch."""
    threads = torch.get_num_threads()
    yield LLM(str(CKPT), batch_invariant=True, num_kv_blocks=1024, enable_prefix_caching=False, encoder_cache_items=1,
              cpu_threads=1)
    torch.set_num_threads(threads)


def _batch() -> tuple[list[dict], list[SamplingParams]]:
    parts = (MIXED * 2)[:32]
    prompts = [case(p, seed) for seed, p in enumerate(parts)]
    params = [SamplingParams(temperature=0.0, max_tokens=8) if i % 2 == 0 else
              SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=1000 + i, max_tokens=8, logprobs=2)
              for i in range(32)]
    return prompts, params


def test_alone_equals_inside_batch_of_32(cold_llm):
    prompts, params = _batch()
    batched = cold_llm.generate(prompts, params, use_tqdm=False)
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        alone = cold_llm.generate([prompt], p, use_tqdm=False)[0].outputs[0]
        inside = batched[i].outputs[0]
        assert alone.token_ids == inside.token_ids, f"request {i}: tokens depend on the batch"
        diff = max(abs(a - b) for a, b in zip(alone.logprobs, inside.logprobs, strict=True))
        assert diff <= 1e-6, f"request {i}: logprobs differ by {diff}"


def test_seeded_sampling_reproducible_and_seed_sensitive(cold_llm):
    prompt = case([5, ("image", 1, 4, 8), 7], seed=3)
    params = SamplingParams(temperature=1.0, seed=42, max_tokens=16)
    first = cold_llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    again = cold_llm.generate([prompt, case([30], seed=9)], [params, SamplingParams(temperature=1.0, max_tokens=4)],
                              use_tqdm=False)[0].outputs[0]
    other = cold_llm.generate([prompt], SamplingParams(temperature=1.0, seed=43, max_tokens=16),
                              use_tqdm=False)[0].outputs[0]
    assert first.token_ids == again.token_ids and first.logprobs == again.logprobs
    assert first.token_ids != other.token_ids


def test_n_samples_seeded_distinct_and_reproducible(cold_llm):
    prompt = case([4, ("image", 1, 4, 4), 4], seed=5)
    params = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=12)
    a = cold_llm.generate([prompt], params, use_tqdm=False)[0]
    b = cold_llm.generate([prompt], params, use_tqdm=False)[0]
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    assert len({tuple(o.token_ids) for o in a.outputs}) > 1
    assert [o.index for o in a.outputs] == [0, 1, 2, 3]


@pytest.mark.parametrize("path", ["packed", "torch", "tiles"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_types_alone_equal_inside_batch(dtype, path):
    """Half types under batch_invariant, with each CPU GEMM path forced (models/half_gemm_path.py): every GEMM of a
    padded batch (>= 16 rows) takes the dtype's one path, and neither path's rows depend on the row count from 16
    up, so the guarantee holds on a CPU of either kind. A path switch inside a batch (say tiles from 32 rows, torch
    below) would change the logprobs of a request run alone against the same request among 32."""
    if path == "packed" and not cpu_features().native(getattr(torch, dtype)):
        pytest.skip(f"oneDNN packs {dtype} only on a CPU with native {dtype} arithmetic (this one: F.linear)")
    threads = torch.get_num_threads()
    with forced_path(path):
        llm = LLM(str(CKPT), dtype=dtype, batch_invariant=True, num_kv_blocks=512, enable_prefix_caching=False,
                  encoder_cache_items=1, cpu_threads=1)
        prompts, params = _batch()  # 32 decode rows together, 16 (padded) alone
        batched = llm.generate(prompts, params, use_tqdm=False)
        for i in (0, 1, 5, 30):
            alone = llm.generate([prompts[i]], params[i], use_tqdm=False)[0].outputs[0]
            assert alone.token_ids == batched[i].outputs[0].token_ids, f"request {i}: tokens depend on the batch"
            assert alone.logprobs == batched[i].outputs[0].logprobs, f"request {i}: logprobs depend on the batch"
    torch.set_num_threads(threads)
