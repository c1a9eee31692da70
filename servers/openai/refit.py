"""Weight refits over HTTP: safetensors from disk into the running engine in buckets, and the weight version."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from mm_infer.engine.async_engine import AsyncEngine
from mm_infer.rl.weights import TensorEntry, plan_refit, read_buckets
from servers.openai.errors import ApiError
from servers.openai.pause import PauseGate

T = TypeVar("T")
DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class RefitResult:
    weight_version: int
    num_tensors: int
    num_buckets: int
    num_paused_requests: int


class Refitter:
    """One refit at a time; the version is the engine's. Unless the server is paused already, a refit pauses it in mode
    "wait" (running requests finish on the old weights, new ones wait; "abort" on request) and resumes it after."""

    def __init__(self, engine: AsyncEngine, gate: PauseGate) -> None:
        self.engine = engine
        self.gate = gate
        self._lock = asyncio.Lock()

    @property
    def version(self) -> int:
        return self.engine.engine.weight_version

    def _locked(self, fn: Callable[..., T], *args: Any) -> T:
        return self.engine.run_locked(fn, *args)  # never in the middle of an engine step

    def _apply(self, entries: list[TensorEntry], version: int, bucket_bytes: int) -> int:
        buckets = 0
        for bucket in read_buckets(entries, bucket_bytes):
            self._locked(self.engine.engine.update_weights, bucket, version)
            buckets += 1
        return buckets

    async def from_disk(self, model_path: str, version: int | None, bucket_bytes: int | None,
                        abort_running: bool = False) -> RefitResult:
        """Check every name and shape first (400, nothing loaded), then load bucket by bucket."""
        async with self._lock:
            try:
                entries = await asyncio.to_thread(plan_refit, model_path, self.engine.engine.model)
            except Exception as e:  # missing, unreadable or corrupt files, foreign names, wrong shapes
                raise ApiError(400, f"cannot refit from {model_path!r}: {e}", param="model_path") from None
            new = self.version + 1 if version is None else version
            pause_here = not self.gate.paused
            mode = "abort" if abort_running else "wait"
            paused = await self.gate.pause(mode) if pause_here else self.gate.num_inflight
            try:
                buckets = await asyncio.to_thread(self._apply, entries, new, bucket_bytes or DEFAULT_BUCKET_BYTES)
            finally:
                if pause_here and self.gate.mode == mode:  # a /pause sent meanwhile outlives the refit
                    self.gate.resume()
            return RefitResult(new, len(entries), buckets, paused)

    async def reset_caches(self) -> None:
        """Forget prefix KV and vision embeddings (running requests keep their own blocks)."""
        await asyncio.to_thread(self._locked, self.engine.engine.reset_caches)
