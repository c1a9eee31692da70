"""The pool's end of every control operation: each ControlOp fanned out to every replica, with what a pool adds
(one copy of a refit in the object store, the weight journal for restarts, and the answers of many replicas merged)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import ray

from mm_infer.distributed.errors import describe_failure
from mm_infer.distributed.supervisor import Supervisor
from mm_infer.engine.control.ops import (
    CommitWeights,
    ControlOp,
    DiscardWeights,
    Freeze,
    JoinTransfer,
    ReceiveWeights,
    SleepStatus,
    UpdateWeights,
)
from mm_infer.engine.control.sleep_state import SleepState

FanOut = Callable[..., Awaitable[list[Any]]]  # (actor method, *args) -> the answers of every up replica


class PoolControl:
    """Holds what the pool answers for its replicas: the weight version, the sleep state, and the names of the
    weight-transfer round staged on them."""

    def __init__(self, supervisor: Supervisor, fan_out: FanOut, version: int) -> None:
        self.supervisor = supervisor
        self._fan_out = fan_out
        self.version = version
        self.sleep_state = SleepState()
        self._round_names: list[str] = []

    async def apply(self, op: ControlOp) -> Any:
        if isinstance(op, Freeze):  # replicas the supervisor restarts come back in this state
            with self.supervisor.lock:
                self.supervisor.frozen = op.frozen
        if isinstance(op, UpdateWeights):
            return await self._refit(op)
        if isinstance(op, CommitWeights):
            return await self._commit(op)
        results = await self._fan_out("control", op)
        if isinstance(op, (JoinTransfer, DiscardWeights)):
            self._round_names = []
        if isinstance(op, ReceiveWeights):  # every replica staged the round; the least count is what all hold
            self._round_names += [m.name for m in op.update.metas]
            return min(results, default=0)
        if results and isinstance(results[0], SleepState):
            self.sleep_state = results[0]  # the replicas agree: they sleep and wake together
        return results[0] if results else None

    async def _refit(self, op: UpdateWeights) -> int:
        """One copy of the bucket in the object store, read by every replica; journaled for restarts. A refit that
        fails on some replica restarts them all from the checkpoint and the journal without it."""
        ref = ray.put(op.bucket)
        supervisor = self.supervisor
        with supervisor.lock:
            entry = supervisor.journal.record(ref, [name for name, _ in op.bucket], op.version)
        try:
            await self._fan_out("control", replace(op, bucket=ref))
        except Exception as exc:
            with supervisor.lock:
                supervisor.journal.forget(entry)
            for slot in supervisor.up_slots():
                supervisor.mark_down(slot.index, slot.incarnation, f"a refit failed ({describe_failure(exc)}); "
                                     "restarting so that every replica holds the same weights")
            raise
        with supervisor.lock:
            supervisor.journal.commit(entry)
        self.version = op.version  # moves once every replica that is up has the bucket
        await self._refresh_sleep()
        return op.version

    async def _commit(self, op: CommitWeights) -> tuple[int, None]:
        """Swap in on every replica; the first one's staged tensors go to the weight journal (by a reference this
        process owns, never copied through it), so a replica restarted later catches up to this version."""
        supervisor = self.supervisor
        slots = supervisor.up_slots()
        refs = [slot.handle.commit_kept.options(num_returns=2).remote(op.version) if i == 0 else
                (slot.handle.control.remote(op), None) for i, slot in enumerate(slots)]
        answers = await asyncio.gather(*(count for count, _ in refs))
        counts = [a[0] if isinstance(a, tuple) else a for a in answers]
        if refs:
            with supervisor.lock:
                supervisor.journal.commit(supervisor.journal.record(refs[0][1], self._round_names, op.version))
        self._round_names = []
        self.version = op.version
        await self._refresh_sleep()
        return min(counts, default=0), None

    async def _refresh_sleep(self) -> None:
        """After a refit: a level-2 sleeper serves again once every weight was reloaded (on every replica)."""
        if self.sleep_state.weights == "unloaded":
            self.sleep_state = (await self._fan_out("control", SleepStatus()))[0]
