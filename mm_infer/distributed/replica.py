"""EngineReplica: one LLMEngine stepped by an AsyncEngine inside a Ray actor process (one device or CPU core)."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import torch

from mm_infer.distributed.coalesce import first_and_last, latest_only
from mm_infer.distributed.media_refs import attach
from mm_infer.engine.async_engine import AsyncEngine
from mm_infer.engine.engine import LLMEngine
from mm_infer.engine.outputs import RequestOutput
from mm_infer.engine.request import VLMRequest
from mm_infer.engine.sampling import SamplingParams


class EngineReplica:
    """The body of a Ray actor (wrapped with ray.remote by the pool). Requests arrive prepared (VLMRequest)."""

    def __init__(self, index: int, model_dir: str, options: dict[str, Any], cpu: int | None = None,
                 stream_interval_s: float = 0.02) -> None:
        if cpu is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {cpu})  # one core per replica: replicas never compete for a core
            torch.set_num_threads(1)
        self.index = index
        self.core = LLMEngine.from_options(model_dir, **options)
        self.stream = AsyncEngine(self.core)
        self.stream_interval_s = stream_interval_s
        self.requests_by_key: Counter[str] = Counter()
        self.requests = 0

    def describe(self) -> dict[str, Any]:
        runtime = self.core.runtime
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        return {"index": self.index, "pid": os.getpid(), "cpus": cpus, "max_model_len": runtime.max_model_len,
                "vocab_size": runtime.vocab_size, "weight_version": self.core.weight_version,
                "device": str(next(self.core.model.parameters()).device)}

    async def generate(self, request: VLMRequest, media: list[Any], params: SamplingParams, request_id: str,
                       affinity_key: str | None = None, stream: bool = True) -> AsyncIterator[RequestOutput]:
        """Snapshots of one request (its pixel values arrive as object-store refs, one per media item), each
        stamped with the weight version it was produced under and this replica's index: with `stream`, at most
        one per stream interval; else only the first and the final one."""
        if media:
            request = attach(request, list(await asyncio.gather(*media)))
        self.requests += 1
        if affinity_key is not None:
            self.requests_by_key[affinity_key] += 1
        source = self.stream.generate(request, params, request_id)
        snapshots = latest_only(source, self.stream_interval_s) if stream else first_and_last(source)
        async for out in snapshots:
            out.extra["weight_version"] = self.core.weight_version
            out.extra["replica"] = self.index
            yield out

    def abort(self, request_id: str) -> None:
        self.stream.abort(request_id)

    def ping(self) -> dict[str, Any]:
        """Liveness plus the gauges the server exports (read between steps, without the step lock)."""
        core = self.core
        return {**core.stats(), "alive": self.stream.is_alive, "waiting": len(core.scheduler.waiting),
                "running": len(core.scheduler.running), "weight_version": core.weight_version,
                "requests": self.requests, "frozen": self.stream.frozen}

    def counters(self) -> dict[str, Any]:
        return {"index": self.index, "requests": self.requests, "requests_by_key": dict(self.requests_by_key),
                **self.core.stats()}

    async def update_weights(self, bucket: list[tuple[str, torch.Tensor]], version: int) -> int:
        await asyncio.to_thread(self.stream.run_locked, self.core.update_weights, bucket, version)
        return self.core.weight_version

    def set_frozen(self, frozen: bool) -> None:
        self.stream.set_frozen(frozen)

    async def reset_caches(self) -> None:
        await asyncio.to_thread(self.stream.run_locked, self.core.reset_caches)

    def shutdown(self) -> None:
        self.stream.shutdown()
