"""EngineReplica: one LLMEngine stepped by an AsyncEngine inside a Ray actor process (one device or CPU core)."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
import torch

from mm_infer.distributed.coalesce import coalesced
from mm_infer.distributed.errors import portable_error
from mm_infer.distributed.media_refs import attach
from mm_infer.engine.async_engine import AsyncEngine
from mm_infer.engine.control.ops import Bucket, CommitWeights, ControlOp, EngineControl, UpdateWeights
from mm_infer.engine.open_engine import open_engine
from mm_infer.engine.outputs.edge import wire_kind
from mm_infer.engine.outputs.request_output import RequestOutput, merge_delta
from mm_infer.engine.runner.host_allocator import keep_step_memory
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.prompt.request import VLMRequest


def pin_process(index: int, width: int = 1) -> int | None:
    """Pin every thread of this process (Ray's own included) to cores index * width .. + width - 1 modulo the cores
    this process may use on its own node; threads and processes started later inherit them (a tensor-parallel
    replica's other ranks). Returns the first core (None where pinning is unsupported)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    cpus = {cores[(index * width + i) % len(cores)] for i in range(width)}
    tasks = Path("/proc/self/task")
    for tid in [int(t.name) for t in tasks.iterdir()] if tasks.is_dir() else [0]:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:  # a thread that just exited
            pass
    return cores[index * width % len(cores)]


class EngineReplica:
    """The body of a Ray actor (wrapped with ray.remote by the pool). Requests arrive prepared (VLMRequest)."""

    def __init__(self, index: int, model_dir: str, options: dict[str, Any], pin_cpu: bool = False,
                 stream_interval_s: float = 0.02) -> None:
        keep_step_memory()  # the actor's process is ours
        if pin_cpu:
            ranks = int(options.get("tensor_parallel_size") or 1)
            pin_process(index, ranks)
            torch.set_num_threads(1)  # one per rank: LeaderEngine gives each rank this process's threads / ranks
        self.index = index
        self.core = open_engine(model_dir, **options)
        self.async_engine = AsyncEngine(self.core)
        self.engine_control = EngineControl(self.core, index)  # joins a transfer group at rank_offset + index
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
        if stream:  # deltas on the wire, joined per stream interval; the pool's edge builds what the reader asked
            params = replace(params, output_kind=wire_kind(params.output_kind))
        return self.async_engine.generate(request, params, request_id, stream)

    def _stamp(self, out: RequestOutput) -> RequestOutput:
        out.extra["weight_version"] = self.core.weight_version  # the version that produced it
        out.extra["replica"] = self.index
        return out

    async def generate(self, request: VLMRequest, media: list[Any], params: SamplingParams, request_id: str,
                       affinity_key: str | None = None) -> AsyncIterator[RequestOutput]:
        """One request's deltas, those within a stream interval joined (none dropped; the final one always sent),
        stamped. A failure crosses to the pool as a portable error (its status and text kept), never as one Ray
        cannot rebuild."""
        try:
            source = await self._start(request, media, params, request_id, affinity_key)
            async for out in coalesced(source, self.stream_interval_s, merge_delta):
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

    async def control(self, op: ControlOp) -> Any:
        """One control operation on this replica's engine (a refit's bucket arrives as an object-store ref)."""
        if isinstance(op, UpdateWeights) and isinstance(op.bucket, ray.ObjectRef):
            op = replace(op, bucket=await op.bucket)
        return await self.async_engine.control(self.engine_control, op)

    async def commit_kept(self, version: int) -> tuple[int, Bucket]:
        """CommitWeights returning its two parts as two objects (the pool keeps the staged tensors' reference for
        its journal, owned by the pool's process, never copied through it)."""
        count, staged = await self.control(CommitWeights(version, keep=True))
        return count, staged

    def shutdown(self) -> None:
        self.async_engine.shutdown()
