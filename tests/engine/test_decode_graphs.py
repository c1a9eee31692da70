"""The static decode path: buckets, padding rows that touch no real KV, results equal to the bucketed path."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from engine_cases import CKPT, case

from mm_infer import LLM, SamplingParams
from mm_infer.engine.runner.decode_graphs import bucket_sizes

PROMPTS = [case([5 + i, ("image", 1, 4, 4), 3], seed=40 + i) for i in range(3)]


def test_bucket_sizes():
    assert bucket_sizes(256)[:8] == [1, 2, 4, 8, 16, 24, 32, 40] and bucket_sizes(256)[-1] == 256
    assert bucket_sizes(20) == [1, 2, 4, 8, 16, 20] and bucket_sizes(1) == [1]


def run(llm: LLM, prompts, **kw):
    return llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2, **kw),
                        use_tqdm=False)


def test_static_decode_equals_the_bucketed_path_and_padding_rows_touch_nothing():
    # 3 rows run in the bucket of 4: the padding row writes only the scratch block, so every row equals its run
    # alone, and the static path gives the bucketed (batch_invariant) path's tokens and logprobs
    static = LLM(str(CKPT), num_kv_blocks=256, cpu_threads=1)
    bucketed = LLM(str(CKPT), num_kv_blocks=256, cpu_threads=1, batch_invariant=True)
    together = run(static, PROMPTS)
    assert sorted(static.engine.runner.graphs.buffers) == [4]  # all three prefilled together, then decoded
    reference = run(bucketed, PROMPTS)
    for i, prompt in enumerate(PROMPTS):
        alone = run(static, [prompt])[0].outputs[0]
        got, ref = together[i].outputs[0], reference[i].outputs[0]
        assert got.token_ids == alone.token_ids == ref.token_ids
        assert max(abs(a - b) for a, b in zip(got.logprobs, ref.logprobs, strict=True)) < 1e-5
    scratch = static.engine.runner.graphs.scratch_block
    assert scratch == static.engine.block_manager.num_blocks  # the block the manager never hands out
    kv = static.engine.runner.kv
    zero = static.engine.runner.zero_block  # the block padded reads gather: after it, and never written
    assert zero == scratch + 1 and kv.k.shape[2] == (zero + 1) * 16 and torch.isfinite(kv.k).all()
    assert not kv.k[:, :, zero * 16:].any() and not kv.v[:, :, zero * 16:].any()


def test_triton_paged_decode_in_the_engine_gives_the_torch_tokens(monkeypatch):
    # the Triton kernel (here in its interpreter) on the engine's real KV layout: int32 tables sliced from the
    # bucket buffers, head-major caches, padded rows on the scratch block
    if importlib.util.find_spec("triton") is None:  # find, not import: triton must load after TRITON_INTERPRET
        pytest.skip("triton is not installed")
    prompts = PROMPTS[:2]
    reference = run(LLM(str(CKPT), num_kv_blocks=64, cpu_threads=1), prompts)
    monkeypatch.setenv("MM_INFER_KERNELS", "triton")
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    got = run(LLM(str(CKPT), num_kv_blocks=64, cpu_threads=1), prompts)
    for a, b in zip(got, reference, strict=True):
        assert a.error is None, a.error.message
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert max(abs(x - y) for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True)) < 1e-4
