"""The EngineBackend seam a server talks to: LocalBackend (one engine here) or distributed.ReplicaPool (replicas)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from mm_infer.engine.async_engine import AsyncEngine
from mm_infer.engine.control.ops import ControlOp, EngineControl
from mm_infer.engine.control.sleep_state import SleepState
from mm_infer.engine.engine import LLMEngine
from mm_infer.engine.outputs.request_output import RequestOutput
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.prompt.preparer import Prompt, PromptPreparer


@dataclass(frozen=True)
class BackendFacts:
    """What a backend's engines are, fixed at start-up."""

    max_model_len: int
    vocab_size: int
    transfer_world_size: int  # engines that join a weight-transfer group (ranks rank_offset .. + this - 1)


class EngineBackend(Protocol):
    """One engine, an engine-core process, or a pool of replicas, as every endpoint sees it: requests in, outputs
    out, facts, live state, and one control call that carries any ControlOp to the engines."""

    preparer: PromptPreparer  # tokenizer, chat renderer, placeholder ids, media defaults
    facts: BackendFacts

    @property
    def is_alive(self) -> bool: ...
    @property
    def weight_version(self) -> int: ...
    @property
    def sleep_state(self) -> SleepState: ...
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
    async def control(self, op: ControlOp) -> Any:
        """Apply `op` on every engine (engine/control/ops.py says what each returns; a pool answers with the first
        engine's result, or the least count)."""
        ...
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
            from mm_infer.models.loader import model_class

            config = self.preparer.model_config
            with torch.device("meta"):
                self._reference = model_class(config)(config)
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
        self.engine_control = EngineControl(core)
        self.facts = BackendFacts(core.runtime.max_model_len, core.runtime.vocab_size, 1)

    @property
    def is_alive(self) -> bool:
        return self.async_engine.is_alive

    @property
    def weight_version(self) -> int:
        return self.core.weight_version

    @property
    def sleep_state(self) -> SleepState:
        return self.core.sleep_state

    @property
    def reference_model(self) -> torch.nn.Module:
        return self.core.model

    def generate(self, prompt: Prompt, params: SamplingParams | None, request_id: str, affinity: str | None = None,
                 stream: bool = True) -> AsyncIterator[RequestOutput]:
        return self.async_engine.generate(prompt, params, request_id, stream)

    def abort(self, request_id: str) -> None:
        self.async_engine.abort(request_id)

    async def control(self, op: ControlOp) -> Any:
        return await self.async_engine.control(self.engine_control, op)

    def engine_gauges(self) -> dict[str, float]:
        return engine_gauges(self.core.stats())

    def shutdown(self) -> None:
        self.async_engine.shutdown()
