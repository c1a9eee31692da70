"""The EngineBackend seam a server talks to: LocalBackend (one engine here) or distributed.ReplicaPool (replicas)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any, Protocol

import torch

from mm_infer.engine.async_engine import AsyncEngine
from mm_infer.engine.engine import LLMEngine
from mm_infer.engine.outputs import CompletionOutput, RequestOutput
from mm_infer.engine.sampling import RequestOutputKind, SamplingParams
from mm_infer.engine.sleep import SleepState, sleep, wake_up
from mm_infer.engine.weight_receiver import TransferInit, TransferUpdate, WeightReceiver
from mm_infer.prompt.inputs import PromptInput
from mm_infer.prompt.preparer import PromptPreparer
from mm_infer.prompt.request import VLMRequest

Bucket = list[tuple[str, torch.Tensor]]
Prompt = str | Mapping[str, Any] | PromptInput | VLMRequest


class EngineBackend(Protocol):
    """One engine or a pool of replicas, as every endpoint sees it."""

    preparer: PromptPreparer  # tokenizer, chat renderer, placeholder ids, media defaults

    @property
    def max_model_len(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def is_alive(self) -> bool: ...
    @property
    def weight_version(self) -> int: ...
    @property
    def reference_model(self) -> torch.nn.Module:
        """Names and shapes a refit is checked against (may live on the meta device)."""
        ...

    def generate(self, prompt: Prompt, params: SamplingParams | None, request_id: str, affinity: str | None = None,
                 stream: bool = True) -> AsyncIterator[RequestOutput]:
        """Outputs per params.output_kind until finished; `affinity` keys the replica choice where there is one
        to make; without `stream`, only the final output."""
        ...
    def abort(self, request_id: str) -> None: ...
    async def set_frozen(self, frozen: bool) -> None: ...
    async def update_weights(self, bucket: Bucket, version: int) -> None: ...
    async def reset_caches(self) -> None: ...
    # weight transfer (engine/weight_receiver.py) and sleep (engine/sleep.py)
    @property
    def transfer_world_size(self) -> int:
        """Engines that join a weight-transfer group (ranks rank_offset .. rank_offset + this - 1)."""
        ...
    async def init_weight_transfer(self, init: TransferInit) -> None: ...
    async def receive_weights(self, update: TransferUpdate) -> int: ...
    async def commit_weights(self, version: int) -> int:
        """Swap the staged tensors in everywhere (between steps); returns how many tensors."""
        ...
    async def discard_weights(self) -> None: ...
    @property
    def sleep_state(self) -> SleepState: ...
    async def sleep(self, level: int) -> SleepState: ...
    async def wake_up(self, tags: list[str] | None) -> SleepState: ...
    def engine_gauges(self) -> dict[str, float]: ...
    def shutdown(self) -> None: ...


class MetaReference:
    """`reference_model` for backends whose engines live in other processes: the checkpoint's model on the meta
    device, built once on first use (the names and shapes a refit is checked against, no memory)."""

    preparer: PromptPreparer
    _reference: torch.nn.Module | None = None

    @property
    def reference_model(self) -> torch.nn.Module:
        if self._reference is None:
            from mm_infer.models.qwen2_vl import QwenVLModel

            with torch.device("meta"):
                self._reference = QwenVLModel(self.preparer.model_config)
        return self._reference


def engine_gauges(stats: Mapping[str, float]) -> dict[str, float]:
    """An engine's stats() under the gauge names the server exports; vLLM's request series and the cache config
    (keys with a "|") pass through as they are."""
    return {**{k: v for k, v in stats.items() if "|" in k},
            "num_requests_waiting": stats["num_waiting"], "num_sequences_running": stats["num_running"],
            "kv_blocks_free": stats["free_blocks"], "kv_blocks_total": stats["num_blocks"],
            "prefix_cache_query_tokens": stats["prefix_query_tokens"],
            "prefix_cache_hit_tokens": stats["prefix_hit_tokens"],
            "encoder_cache_hits": stats["encoder_cache_hits"], "encoder_calls": stats["encoder_calls"],
            "preemptions": stats["preemptions"]}


class LocalBackend:
    """One LLMEngine (`core`) stepped by an AsyncEngine (`async_engine`) in this process."""

    def __init__(self, core: LLMEngine) -> None:
        self.core = core
        self.async_engine = AsyncEngine(core)
        self.preparer = core.preparer
        self.receiver = WeightReceiver(core.device)

    @property
    def max_model_len(self) -> int:
        return self.core.runtime.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.core.runtime.vocab_size

    @property
    def is_alive(self) -> bool:
        return self.async_engine.is_alive

    @property
    def weight_version(self) -> int:
        return self.core.weight_version

    @property
    def reference_model(self) -> torch.nn.Module:
        return self.core.model

    def generate(self, prompt: Prompt, params: SamplingParams | None, request_id: str, affinity: str | None = None,
                 stream: bool = True) -> AsyncIterator[RequestOutput]:
        return self.async_engine.generate(prompt, params, request_id, stream)

    def abort(self, request_id: str) -> None:
        self.async_engine.abort(request_id)

    async def set_frozen(self, frozen: bool) -> None:
        await asyncio.to_thread(self.async_engine.set_frozen, frozen)  # freezing waits for a step under way

    async def update_weights(self, bucket: Bucket, version: int) -> None:
        await asyncio.to_thread(self.async_engine.run_locked, self.core.update_weights, bucket, version)

    async def reset_caches(self) -> None:
        await asyncio.to_thread(self.async_engine.run_locked, self.core.reset_caches)

    @property
    def transfer_world_size(self) -> int:
        return 1

    async def init_weight_transfer(self, init: TransferInit) -> None:
        await asyncio.to_thread(self.receiver.join, init)

    async def receive_weights(self, update: TransferUpdate) -> int:
        return await asyncio.to_thread(self.receiver.receive, update)

    async def commit_weights(self, version: int) -> int:
        staged = self.receiver.take()
        await asyncio.to_thread(self.async_engine.run_locked, self.core.update_weights, staged, version)
        return len(staged)

    async def discard_weights(self) -> None:
        self.receiver.discard()

    @property
    def sleep_state(self) -> SleepState:
        return self.core.sleep_state

    async def sleep(self, level: int) -> SleepState:
        return await asyncio.to_thread(self.async_engine.run_locked, sleep, self.core, level)

    async def wake_up(self, tags: list[str] | None) -> SleepState:
        return await asyncio.to_thread(self.async_engine.run_locked, wake_up, self.core, tags)

    def engine_gauges(self) -> dict[str, float]:
        return engine_gauges(self.core.stats())

    def shutdown(self) -> None:
        self.async_engine.shutdown()


class DeltaTracker:
    """Turns one request's cumulative outputs into DELTA outputs (for backends whose transport sends snapshots)."""

    def __init__(self) -> None:
        self._sent: dict[int, tuple[int, int]] = {}  # sample index -> (tokens, characters) already sent

    def delta(self, out: RequestOutput) -> RequestOutput:
        outputs = []
        for c in out.outputs:
            tokens, chars = self._sent.get(c.index, (0, 0))
            outputs.append(CompletionOutput(
                c.index, c.text[chars:], c.token_ids[tokens:], c.logprobs[tokens:], c.finish_reason, c.stop_reason,
                None if c.top_logprobs is None else c.top_logprobs[tokens:], c.cumulative_logprob))
            self._sent[c.index] = (len(c.token_ids), len(c.text))
        return replace(out, outputs=outputs)


def wants_deltas(params: SamplingParams | None) -> bool:
    return params is not None and params.output_kind is RequestOutputKind.DELTA
