"""Control operations on a running engine (freeze, refits, weight transfer, sleep, cache reset): one typed value each,
applied by `EngineControl` beside the engine, carried unchanged by every backend in between."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from mm_infer.transfer.receiver import TransferInit, TransferUpdate, WeightReceiver

if TYPE_CHECKING:
    from mm_infer.engine.engine import LLMEngine

Bucket = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class ControlOp:
    """One operation. `between_steps`: it runs where no step is under way (the step lock, the core's loop);
    otherwise beside serving (a broadcast that stages tensors). `refit`: it changes the weights, so a backend that
    restarts engines journals it and rereads the sleep state after it."""

    between_steps: ClassVar[bool] = True
    refit: ClassVar[bool] = False


@dataclass(frozen=True)
class Freeze(ControlOp):
    """No step runs while frozen (requests wait with their KV); returns once a step under way has landed."""

    frozen: bool


@dataclass(frozen=True)
class UpdateWeights(ControlOp):
    """Load named tensors (HF names) and set the weight version. Returns the new version."""

    bucket: Bucket
    version: int
    refit: ClassVar[bool] = True


@dataclass(frozen=True)
class ResetCaches(ControlOp):
    """Drop the prefix cache and the encoder cache."""


@dataclass(frozen=True)
class JoinTransfer(ControlOp):
    """Join the trainer's weight-transfer group (each engine at rank_offset + its index). Returns the rank."""

    init: TransferInit
    between_steps: ClassVar[bool] = False


@dataclass(frozen=True)
class ReceiveWeights(ControlOp):
    """Receive one broadcast round into staging buffers, beside serving. Returns how many tensors were staged."""

    update: TransferUpdate
    between_steps: ClassVar[bool] = False


@dataclass(frozen=True)
class CommitWeights(ControlOp):
    """Swap the staged tensors in at `version`. Returns (count, the staged tensors on the host if `keep`, else
    None): a backend that journals refits asks to keep them."""

    version: int
    keep: bool = False
    refit: ClassVar[bool] = True


@dataclass(frozen=True)
class DiscardWeights(ControlOp):
    """Drop what a broadcast staged without loading it."""

    between_steps: ClassVar[bool] = False


@dataclass(frozen=True)
class Sleep(ControlOp):
    """vLLM's sleep levels 0, 1, 2 (the engine must be idle). Returns the SleepState."""

    level: int


@dataclass(frozen=True)
class WakeUp(ControlOp):
    """Bring back what `tags` names ("weights", "kv_cache"; None: both). Returns the SleepState."""

    tags: tuple[str, ...] | None = None


@dataclass(frozen=True)
class SleepStatus(ControlOp):
    """The SleepState as it stands (a level-2 sleeper serves again once every weight was refit)."""

    between_steps: ClassVar[bool] = False


class EngineControl:
    """The engine's end of every control operation: the engine and its weight receiver. A Freeze is answered by
    whoever steps the engine (it owns the loop); everything else is applied here."""

    def __init__(self, engine: LLMEngine, rank_index: int = 0) -> None:
        self.engine = engine
        self.receiver = WeightReceiver(engine.device, rank_index)  # joins at rank_offset + rank_index
        self._handlers: dict[type[ControlOp], Callable[[Any], Any]] = {
            UpdateWeights: self._update_weights, ResetCaches: lambda op: engine.reset_caches(),
            JoinTransfer: lambda op: self.receiver.join(op.init),
            ReceiveWeights: lambda op: self.receiver.receive(op.update),
            CommitWeights: self._commit_weights, DiscardWeights: lambda op: self.receiver.discard(),
            Sleep: lambda op: engine.sleep(op.level), WakeUp: lambda op: engine.wake_up(op.tags),
            SleepStatus: lambda op: engine.sleep_state}

    def apply(self, op: ControlOp) -> Any:
        """Run `op` now (the caller has made sure no step is under way when `op.between_steps`)."""
        handler = self._handlers.get(type(op))
        if handler is None:
            raise TypeError(f"no engine handler for the control operation {type(op).__name__}")
        return handler(op)

    def _update_weights(self, op: UpdateWeights) -> int:
        self.engine.update_weights(op.bucket, op.version)
        return self.engine.weight_version

    def _commit_weights(self, op: CommitWeights) -> tuple[int, Bucket | None]:
        staged = self.receiver.take()
        self.engine.update_weights(staged, op.version)
        return len(staged), [(name, t.cpu()) for name, t in staged] if op.keep else None
