"""generate_batch: LLM.generate's call shape over a ReplicaPool, for trainers that drive the pool from Python."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

from mm_infer.distributed.pool import ReplicaPool
from mm_infer.engine.outputs.request_output import RequestOutput
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.llm import Prompt, pair_prompts, prepare_all

_batch_ids = itertools.count()


def generate_batch(pool: ReplicaPool, prompts: Prompt | Sequence[Prompt],
                   sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                   affinity_keys: Sequence[str | None] | None = None) -> list[RequestOutput]:
    """One final RequestOutput per prompt, in order. Prompts are prepared here first (bad input fails before
    anything is sent), then all go out at once and the router spreads them; each output's `extra` names its
    replica and weight version. The first failure (a 503 from a dead replica, say) fails the batch and cancels
    the rest. Call it from synchronous code (it runs its own event loop)."""
    prompts, params = pair_prompts(prompts, sampling_params)
    keys = list(affinity_keys) if affinity_keys is not None else [None] * len(prompts)
    if len(keys) != len(prompts):
        raise ValueError(f"{len(keys)} affinity keys for {len(prompts)} prompts")
    requests = prepare_all(pool.prepare, prompts)
    batch = next(_batch_ids)

    async def one(i: int) -> RequestOutput:
        last = None
        async for out in pool.generate(requests[i], params[i], f"batch-{batch}-{i}", keys[i], stream=False):
            last = out
        assert last is not None
        return last

    async def run() -> list[RequestOutput]:
        return list(await asyncio.gather(*(one(i) for i in range(len(requests)))))

    return asyncio.run(run())
