"""Weight refits over HTTP: safetensors from disk into the running engine in buckets, and the weight version."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from mm_infer.engine.control.ops import ResetCaches, UpdateWeights
from mm_infer.rl.weights import TensorEntry, first_nonfinite, plan_refit, read_buckets
from mm_infer.serving import EngineBackend
from servers.openai.bodies.errors import ApiError
from servers.openai.control.pause import PauseGate

DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class RefitResult:
    weight_version: int
    num_tensors: int
    num_buckets: int
    num_paused_requests: int


class Refitter:
    """One refit at a time; the version is the engine's (every replica's). Unless the server is paused already, a
    refit pauses it in mode "wait" (running requests finish on the old weights, new ones wait; "abort" on request)
    and resumes it after."""

    def __init__(self, engine: EngineBackend, gate: PauseGate, allowed_roots: tuple[Path, ...]) -> None:
        self.engine = engine
        self.gate = gate
        self.allowed_roots = tuple(Path(p).resolve() for p in allowed_roots)
        self._lock = asyncio.Lock()

    def _check_path(self, model_path: str) -> None:
        path = Path(model_path).resolve()
        if not any(path.is_relative_to(root) for root in self.allowed_roots):
            raise ApiError(403, f"refits may only read under {', '.join(map(str, self.allowed_roots))} "
                           "(--allowed-weights-path)", param="model_path")

    async def _plan(self, model_path: str, bucket_bytes: int, allow_nonfinite: bool) -> list[TensorEntry]:
        """Names and shapes checked against the model and, unless allowed, every value finite: 400 otherwise."""
        self._check_path(model_path)
        try:
            entries = await asyncio.to_thread(plan_refit, model_path, self.engine.reference_model)
        except Exception as e:  # missing, unreadable or corrupt files, foreign names, wrong shapes
            raise ApiError(400, f"cannot refit from {model_path!r}: {e}", param="model_path") from None
        if not allow_nonfinite and (bad := await asyncio.to_thread(first_nonfinite, entries, bucket_bytes)):
            raise ApiError(400, f"tensor {bad!r} in {model_path!r} holds NaN or inf; nothing was loaded (send "
                           "allow_nonfinite=true to load it anyway)", param="model_path")
        return entries

    @property
    def version(self) -> int:
        return self.engine.weight_version

    async def _apply(self, entries: list[TensorEntry], version: int, bucket_bytes: int) -> int:
        """Read bucket by bucket off the event loop; each is applied between engine steps (on every replica)."""
        buckets = 0
        reader = read_buckets(entries, bucket_bytes)
        while (bucket := await asyncio.to_thread(next, reader, None)) is not None:
            await self.engine.control(UpdateWeights(bucket, version))
            buckets += 1
        return buckets

    async def from_disk(self, model_path: str, version: int | None, bucket_bytes: int | None,
                        abort_running: bool = False, allow_nonfinite: bool = False) -> RefitResult:
        """Check the path, every name and shape and every value first (4xx, nothing loaded), then load bucket by
        bucket."""
        bucket_bytes = bucket_bytes or DEFAULT_BUCKET_BYTES
        async with self._lock:
            entries = await self._plan(model_path, bucket_bytes, allow_nonfinite)
            new = self.version + 1 if version is None else version
            pause_here = not self.gate.paused
            mode = "abort" if abort_running else "wait"
            paused = await self.gate.pause(mode) if pause_here else self.gate.num_inflight
            try:
                buckets = await self._apply(entries, new, bucket_bytes)
            finally:
                if pause_here and self.gate.mode == mode:  # a /pause sent meanwhile outlives the refit
                    await self.gate.resume()
            return RefitResult(new, len(entries), buckets, paused)

    async def reset_caches(self) -> None:
        """Forget prefix KV and vision embeddings (running requests keep their own blocks)."""
        await self.engine.control(ResetCaches())
