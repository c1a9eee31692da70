"""EngineBackend: what the server needs from an engine; LocalBackend is one engine in this process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import torch

from mm_infer.engine.async_engine import AsyncEngine
from mm_infer.engine.engine import LLMEngine
from mm_infer.engine.outputs import RequestOutput
from mm_infer.engine.sampling import SamplingParams
from mm_infer.prompt.media import MediaDefaults
from mm_infer.prompt.placeholders import PlaceholderIds
from mm_infer.prompt.request import VLMRequest

Bucket = list[tuple[str, torch.Tensor]]


class EngineBackend(Protocol):
    """One engine or a pool of replicas, as every endpoint sees it."""

    tokenizer: Any
    placeholder_ids: PlaceholderIds
    media_defaults: MediaDefaults

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

    def prepare(self, prompt: str | Mapping[str, Any]) -> VLMRequest: ...
    def generate(self, prompt: str | Mapping[str, Any] | VLMRequest, params: SamplingParams | None,
                 request_id: str, affinity: str | None = None, stream: bool = True) -> AsyncIterator[RequestOutput]:
        """Snapshots until finished; `affinity` keys the replica choice where there is one to make; without
        `stream` a backend may skip snapshots between the first and the final one."""
        ...
    def abort(self, request_id: str) -> None: ...
    async def set_frozen(self, frozen: bool) -> None: ...
    async def update_weights(self, bucket: Bucket, version: int) -> None: ...
    async def reset_caches(self) -> None: ...
    def engine_gauges(self) -> dict[str, float]: ...
    def shutdown(self) -> None: ...


class LocalBackend:
    """One LLMEngine stepped by an AsyncEngine in this process; `engine` is the core (tests look inside it)."""

    def __init__(self, core: LLMEngine) -> None:
        self.engine = core
        self.stream = AsyncEngine(core)
        self.tokenizer = core.tokenizer
        self.placeholder_ids = core.placeholder_ids
        self.media_defaults = core.media_defaults

    @property
    def max_model_len(self) -> int:
        return self.engine.runtime.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.engine.runtime.vocab_size

    @property
    def is_alive(self) -> bool:
        return self.stream.is_alive

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    @property
    def reference_model(self) -> torch.nn.Module:
        return self.engine.model

    def prepare(self, prompt: str | Mapping[str, Any]) -> VLMRequest:
        return self.engine.prepare(prompt)

    def generate(self, prompt: str | Mapping[str, Any] | VLMRequest, params: SamplingParams | None,
                 request_id: str, affinity: str | None = None, stream: bool = True) -> AsyncIterator[RequestOutput]:
        return self.stream.generate(prompt, params, request_id, stream)

    def abort(self, request_id: str) -> None:
        self.stream.abort(request_id)

    async def set_frozen(self, frozen: bool) -> None:
        self.stream.set_frozen(frozen)

    async def update_weights(self, bucket: Bucket, version: int) -> None:
        await asyncio.to_thread(self.stream.run_locked, self.engine.update_weights, bucket, version)

    async def reset_caches(self) -> None:
        await asyncio.to_thread(self.stream.run_locked, self.engine.reset_caches)

    def engine_gauges(self) -> dict[str, float]:
        stats = self.engine.stats()
        return {"num_requests_waiting": stats["num_waiting"], "num_sequences_running": stats["num_running"],
                "kv_blocks_free": stats["free_blocks"], "kv_blocks_total": stats["num_blocks"],
                "prefix_cache_query_tokens": stats["prefix_query_tokens"],
                "prefix_cache_hit_tokens": stats["prefix_hit_tokens"],
                "encoder_cache_hits": stats["encoder_cache_hits"], "encoder_calls": stats["encoder_calls"],
                "preemptions": stats["preemptions"]}

    def shutdown(self) -> None:
        self.stream.shutdown()
