"""EngineReplica: one LLMEngine stepped by an AsyncEngine inside a Ray actor process (one device or CPU core)."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from mm_infer.distributed.coalesce import latest_only
from mm_infer.distributed.errors import portable_error
from mm_infer.distributed.media_refs import attach
from mm_infer.engine.async_engine import AsyncEngine
from mm_infer.engine.engine import LLMEngine
from mm_infer.engine.host_allocator import keep_step_memory
from mm_infer.engine.outputs import RequestOutput
from mm_infer.engine.sampling import RequestOutputKind, SamplingParams
from mm_infer.engine.sleep import SleepState, sleep, wake_up
from mm_infer.engine.weight_receiver import TransferInit, TransferUpdate, WeightReceiver
from mm_infer.prompt.request import VLMRequest


def pin_process(index: int) -> int | None:
    """Pin every thread of this process (Ray's own included) to core `index` modulo the cores this process may
    use on its own node; threads started later inherit it. Returns the core (None where pinning is unsupported)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    cpu = cores[index % len(cores)]
    tasks = Path("/proc/self/task")
    for tid in [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]:
        try:
            os.sched_setaffinity(tid, {cpu})
        except OSError:  # a thread that just exited
            pass
    return cpu


class EngineReplica:
    """The body of a Ray actor (wrapped with ray.remote by the pool). Requests arrive prepared (VLMRequest)."""

    def __init__(self, index: int, model_dir: str, options: dict[str, Any], pin_cpu: bool = False,
                 stream_interval_s: float = 0.02) -> None:
        keep_step_memory()  # the actor's process is ours
        if pin_cpu:
            pin_process(index)
            torch.set_num_threads(1)
        self.index = index
        self.core = LLMEngine.from_options(model_dir, **options)
        self.async_engine = AsyncEngine(self.core)
        self.receiver = WeightReceiver(self.core.device, index)  # joins a transfer group at rank_offset + index
        self.stream_interval_s = stream_interval_s
        self.requests_by_key: Counter[str] = Counter()
        self.requests = 0

    def describe(self) -> dict[str, Any]:
        runtime = self.core.runtime
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        return {"index": self.index, "pid": os.getpid(), "cpus": cpus, "max_model_len": runtime.max_model_len,
                "vocab_size": runtime.vocab_size, "weight_version": self.core.weight_version,
                "device": str(self.core.device)}

    async def _start(self, request: VLMRequest, media: list[Any], params: SamplingParams, request_id: str,
                     affinity_key: str | None, stream: bool = True) -> AsyncIterator[RequestOutput]:
        """Re-attach the pixel values (object-store refs, one per media item), count, and start the request."""
        if media:
            request = attach(request, list(await asyncio.gather(*media)))
        self.requests += 1
        if affinity_key is not None:
            self.requests_by_key[affinity_key] += 1
        if params.output_kind is RequestOutputKind.DELTA:  # streams coalesce to the latest output: keep them whole
            params = replace(params, output_kind=RequestOutputKind.CUMULATIVE)
        return self.async_engine.generate(request, params, request_id, stream)

    def _stamp(self, out: RequestOutput) -> RequestOutput:
        out.extra["weight_version"] = self.core.weight_version  # the version that produced it
        out.extra["replica"] = self.index
        return out

    async def generate(self, request: VLMRequest, media: list[Any], params: SamplingParams, request_id: str,
                       affinity_key: str | None = None) -> AsyncIterator[RequestOutput]:
        """Snapshots of one request, at most one per stream interval (always the final one), stamped. A failure
        crosses to the pool as a portable error (its status and text kept), never as one Ray cannot rebuild."""
        try:
            source = await self._start(request, media, params, request_id, affinity_key)
            async for out in latest_only(source, self.stream_interval_s):
                yield self._stamp(out)
        except Exception as exc:
            raise portable_error(exc) from None

    async def generate_final(self, request: VLMRequest, media: list[Any], params: SamplingParams, request_id: str,
                             affinity_key: str | None = None) -> RequestOutput:
        """Only the final output, stamped: one plain actor call, about a third of a stream's cost to the router."""
        last = None
        try:
            async for out in await self._start(request, media, params, request_id, affinity_key, stream=False):
                last = out
        except Exception as exc:
            raise portable_error(exc) from None
        assert last is not None and last.finished, "the engine stream ended without a final output"
        return self._stamp(last)

    def abort(self, request_id: str) -> None:
        self.async_engine.abort(request_id)

    def ping(self) -> dict[str, Any]:
        """Liveness plus the gauges the server exports (read between steps, without the step lock)."""
        core, loop = self.core, self.async_engine
        return {**core.stats(), "alive": loop.is_alive, "waiting": core.num_waiting, "running": core.num_running,
                "weight_version": core.weight_version, "requests": self.requests, "frozen": loop.frozen,
                "stalled_s": loop.stalled_for()}

    def counters(self) -> dict[str, Any]:
        return {"index": self.index, "requests": self.requests, "requests_by_key": dict(self.requests_by_key),
                **self.core.stats()}

    async def update_weights(self, bucket: list[tuple[str, torch.Tensor]], version: int) -> int:
        await asyncio.to_thread(self.async_engine.run_locked, self.core.update_weights, bucket, version)
        return self.core.weight_version

    async def init_weight_transfer(self, init: TransferInit) -> int:
        return await asyncio.to_thread(self.receiver.join, init)

    async def receive_weights(self, update: TransferUpdate) -> int:
        return await asyncio.to_thread(self.receiver.receive, update)

    async def commit_weights(self, version: int, keep: bool) -> tuple[int, list[tuple[str, torch.Tensor]] | None]:
        """Swap the staged tensors in; with `keep`, they are also returned (the pool journals them)."""
        staged = self.receiver.take()
        await asyncio.to_thread(self.async_engine.run_locked, self.core.update_weights, staged, version)
        return len(staged), staged if keep else None

    def discard_weights(self) -> None:
        self.receiver.discard()

    async def sleep(self, level: int) -> SleepState:
        return await asyncio.to_thread(self.async_engine.run_locked, sleep, self.core, level)

    async def wake_up(self, tags: list[str] | None) -> SleepState:
        return await asyncio.to_thread(self.async_engine.run_locked, wake_up, self.core, tags)

    def sleep_status(self) -> SleepState:
        return self.core.sleep_state

    async def set_frozen(self, frozen: bool) -> None:
        await asyncio.to_thread(self.async_engine.set_frozen, frozen)  # freezing waits for a step under way

    async def reset_caches(self) -> None:
        await asyncio.to_thread(self.async_engine.run_locked, self.core.reset_caches)

    def shutdown(self) -> None:
        self.async_engine.shutdown()
