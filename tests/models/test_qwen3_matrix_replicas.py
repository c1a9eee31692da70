"""A 2-replica ReplicaPool (local Ray, one core each) on tiny Qwen3-VL answers image and video chats exactly as one
local engine on the same checkpoint does (the replica answering is recorded: both are used)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import torch
from qwen3_cases import QWEN3, chat_prompt

from mm_infer import LLM, SamplingParams

ray = pytest.importorskip("ray")
OPTIONS = {"num_kv_blocks": 256, "max_model_len": 2048, "cpu_threads": 1, "batch_invariant": True}


@pytest.fixture(scope="module")
def pool() -> Iterator:
    from mm_infer.distributed import PoolConfig, ReplicaPool

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    pool = ReplicaPool(PoolConfig(str(QWEN3["qwen3_vl"]), 2, OPTIONS, health_interval_s=0.5))
    yield pool
    pool.shutdown()
    if started:
        ray.shutdown()


async def _final(pool, prompt: dict, params: SamplingParams, rid: str):
    last = None
    async for out in pool.generate(prompt, params, rid, None):
        last = out
    return last


def test_pool_answers_equal_one_local_engine(pool):
    threads = torch.get_num_threads()
    prompts = [chat_prompt(image=["photo.png"]), chat_prompt(image=["rgba.png"], text="Colour?"),
               chat_prompt(video=["odd7_h264_2fps.mp4"]), chat_prompt(image=["gray.png"], text="Shape?")]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=1)

    async def all_of_them():
        return await asyncio.gather(*(_final(pool, p, params, f"q3-{i}") for i, p in enumerate(prompts)))

    outs = asyncio.run(all_of_them())
    want = LLM(str(QWEN3["qwen3_vl"]), **OPTIONS).generate(prompts, params, use_tqdm=False)
    torch.set_num_threads(threads)
    assert {o.extra["replica"] for o in outs} == {0, 1}, "the work was spread over both replicas"
    for got, ref in zip(outs, want, strict=True):
        assert got.prompt_token_ids == ref.prompt_token_ids
        assert got.outputs[0].token_ids == ref.outputs[0].token_ids
        assert got.outputs[0].logprobs == ref.outputs[0].logprobs, "same engine, same maths: bit-equal logprobs"
