"""The pool's RL fan-out: weight transfer (each replica joins at its own rank) and sleep / wake on every replica."""

from __future__ import annotations

import asyncio
from typing import Any

from mm_infer.engine.sleep import SleepState
from mm_infer.engine.weight_receiver import TransferInit, TransferUpdate


class PoolRL:
    """Mixed into ReplicaPool: needs its `_fan_out`, `supervisor`, `config` and `_version`."""

    _round_names: list[str]
    _sleep: SleepState

    async def _fan_out(self, method: str, *args: Any) -> list[Any]: ...  # ReplicaPool's

    @property
    def transfer_world_size(self) -> int:
        return self.config.num_replicas  # type: ignore[attr-defined]

    async def init_weight_transfer(self, init: TransferInit) -> None:
        """Every replica joins at rank_offset + its index, all at once (the rendezvous waits for all)."""
        self._round_names = []
        await self._fan_out("init_weight_transfer", init)

    async def receive_weights(self, update: TransferUpdate) -> int:
        counts = await self._fan_out("receive_weights", update)
        self._round_names += [m.name for m in update.metas]
        return min(counts)

    async def commit_weights(self, version: int) -> int:
        """Swap in on every replica; the first one's staged tensors go to the weight journal (by a reference this
        process owns, never copied through it), so a replica restarted later catches up to this version."""
        supervisor = self.supervisor  # type: ignore[attr-defined]
        slots = supervisor.up_slots()
        refs = [slot.handle.commit_weights.options(num_returns=2).remote(version, i == 0)
                for i, slot in enumerate(slots)]
        counts = await asyncio.gather(*(count for count, _ in refs))
        if refs:
            with supervisor.lock:
                supervisor.journal.commit(supervisor.journal.record(refs[0][1], self._round_names, version))
        self._round_names = []
        self._version = version
        await self._refresh_sleep()
        return min(counts, default=0)

    async def discard_weights(self) -> None:
        self._round_names = []
        await self._fan_out("discard_weights")

    @property
    def sleep_state(self) -> SleepState:
        return self._sleep

    async def sleep(self, level: int) -> SleepState:
        self._sleep = (await self._fan_out("sleep", level))[0]
        return self._sleep

    async def wake_up(self, tags: list[str] | None) -> SleepState:
        self._sleep = (await self._fan_out("wake_up", tags))[0]
        return self._sleep

    async def _refresh_sleep(self) -> None:
        """After a refit: a level-2 sleeper serves again once every weight was reloaded (on every replica)."""
        if self._sleep.weights == "unloaded":
            self._sleep = (await self._fan_out("sleep_status"))[0]
