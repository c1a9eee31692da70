"""vLLM's weight-transfer API: init a group with the trainer, then start / update / finish rounds of broadcasts.

Each round runs with the server paused in mode "wait"; tensors are staged and swapped in by /finish_weight_update
on every engine at once. A broadcast that breaks off leaves the old weights in force and says why."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from mm_infer.engine.control.ops import CommitWeights, DiscardWeights, JoinTransfer, ReceiveWeights
from mm_infer.serving import EngineBackend
from mm_infer.transfer.packing import TensorMeta, dtype_named
from mm_infer.transfer.receiver import TransferFailedError, TransferInit, TransferUpdate, check_metas
from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.weight_transfer import InitInfo, UpdateInfo
from servers.openai.control.pause import PauseGate
from servers.openai.control.sleep import SleepControl

T = TypeVar("T")

OFF = ("weight transfer is off: start the server with --weight-transfer-config '{\"backend\": \"gloo\"}' (CPU) or "
       "'{\"backend\": \"nccl\"}' (CUDA)")


@dataclass
class Round:
    """One start .. finish: whether it paused the server, and the tensors staged so far."""

    paused_here: bool
    tensors: int = 0


def to_metas(info: UpdateInfo) -> tuple[TensorMeta, ...]:
    """update_info's parallel lists -> metas; 400 naming the first bad entry."""
    if not len(info.names) == len(info.dtype_names) == len(info.shapes):
        raise ApiError(400, f"names, dtype_names and shapes must have one entry per tensor; got {len(info.names)}, "
                       f"{len(info.dtype_names)} and {len(info.shapes)}", param="update_info")
    metas = []
    for i, (name, dtype, shape) in enumerate(zip(info.names, info.dtype_names, info.shapes, strict=True)):
        try:
            metas.append(TensorMeta(name, dtype_named(dtype), tuple(shape)))
        except ValueError as e:
            raise ApiError(400, f"update_info.dtype_names[{i}] (tensor {name!r}): {e}", param="update_info") from None
        if any(d < 0 for d in shape):
            raise ApiError(400, f"update_info.shapes[{i}] (tensor {name!r}) has a negative size: {shape}",
                           param="update_info")
    return tuple(metas)


def serialized(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """One session call at a time: a /start_weight_update sent while an update is still receiving waits for it."""
    @functools.wraps(method)
    async def locked(self: TransferSession, *args: Any) -> T:
        async with self.lock:
            return await method(self, *args)
    return locked


class TransferSession:
    """The group (joined once per /init_weight_transfer_engine) and the open round; one call at a time."""

    def __init__(self, backend: str | None, engine: EngineBackend, gate: PauseGate, sleep: SleepControl) -> None:
        self.backend = backend
        self.engine = engine
        self.gate = gate
        self.sleep = sleep
        self.ready = False
        self.round: Round | None = None
        self.last_error: str | None = None
        self.lock = asyncio.Lock()

    def _check_ready(self) -> None:
        if self.backend is None:
            raise ApiError(400, OFF)
        if not self.ready:
            why = f" (the last one failed: {self.last_error})" if self.last_error else ""
            raise ApiError(409, f"no weight-transfer group: POST /init_weight_transfer_engine first{why}")

    @serialized
    async def init(self, info: InitInfo) -> None:
        if self.backend is None:
            raise ApiError(400, OFF)
        if self.backend == "nccl" and not torch.cuda.is_available():
            raise ApiError(400, "the nccl weight transfer backend needs CUDA; this server runs on CPU: start it with "
                           "--weight-transfer-config '{\"backend\": \"gloo\"}'")
        engines = self.engine.facts.transfer_world_size
        if info.rank_offset + engines > info.world_size:
            raise ApiError(400, f"world_size {info.world_size} is too small: this server's {engines} engine(s) take "
                           f"ranks {info.rank_offset}..{info.rank_offset + engines - 1} (see /get_world_size)",
                           param="init_info.world_size")
        if self.round is not None:
            await self._end_round()
        self.ready = False
        init = TransferInit(self.backend, info.master_address, info.master_port, info.rank_offset, info.world_size,
                            info.packed, info.packed_buffer_size_bytes, info.packed_num_buffers, info.timeout_s)
        try:
            await self.engine.control(JoinTransfer(init))
        except Exception as e:  # nobody at the address, a timeout, a rank clash
            self.last_error = f"{type(e).__name__}: {e}"
            raise ApiError(500, f"could not join the weight-transfer group at {info.master_address}:"
                           f"{info.master_port} ({self.last_error})") from None
        self.ready, self.last_error = True, None

    @serialized
    async def start(self) -> None:
        await self._start()

    async def _start(self) -> None:
        """Open a round (a round already open is dropped); pause in mode "wait" unless paused already."""
        self._check_ready()
        if self.round is not None:
            await self._end_round()
        paused_here = not self.gate.paused
        if paused_here:
            await self.gate.pause("wait")
        self.round = Round(paused_here)

    @serialized
    async def update(self, info: UpdateInfo) -> int:
        """Check the announced tensors against the model (400, nothing received), then receive the broadcast."""
        self._check_ready()
        metas = to_metas(info)
        try:
            check_metas(self.engine.reference_model, metas)
        except ValueError as e:
            raise ApiError(400, f"update_info: {e}", param="update_info") from None
        self.sleep.check_refit()
        if self.round is None:
            await self._start()  # vLLM clients that skip /start_weight_update
        assert self.round is not None
        try:
            count = await self.engine.control(ReceiveWeights(
                TransferUpdate(metas, info.packed, info.packed_buffer_size_bytes)))
        except TransferFailedError as e:
            self.ready, self.last_error = False, str(e)
            await self._end_round()
            raise ApiError(500, f"{e}; nothing was loaded: every engine keeps weight version "
                           f"{self.engine.weight_version}. POST /init_weight_transfer_engine again") from None
        self.round.tensors += count
        return count

    @serialized
    async def finish(self, version: int | None) -> tuple[int, int]:
        """Swap the round's tensors in on every engine; (new weight version, tensors loaded)."""
        self._check_ready()
        if self.round is None or not self.round.tensors:
            if self.round is not None:  # TRL's weight_update() finishes in a `finally`: never leave the server paused
                await self._end_round()
            raise ApiError(409, "no weights were received in this round: POST /start_weight_update and "
                           "/update_weights first")
        new = self.engine.weight_version + 1 if version is None else version
        try:
            count, _ = await self.engine.control(CommitWeights(new))
        finally:
            await self._end_round(discard=False)
        await self.sleep.after_refit()
        return new, count

    async def _end_round(self, discard: bool = True) -> None:
        round_, self.round = self.round, None
        if discard:
            await self.engine.control(DiscardWeights())
        if round_ is not None and round_.paused_here and self.gate.mode == "wait":
            await self.gate.resume()
