"""Supervisor: starts replica actors, health-checks them, and restarts a dead one caught up to the weight version."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError

from mm_infer.distributed.counters import SlotCounters, fold_reading
from mm_infer.distributed.errors import describe_failure
from mm_infer.distributed.journal import WeightJournal
from mm_infer.distributed.replica import EngineReplica
from mm_infer.distributed.router import Router
from mm_infer.distributed.slots import PoolConfig, ReplicaSlot, restart_delay_s
from mm_infer.engine.control.ops import Freeze, UpdateWeights

log = logging.getLogger(__name__)


class _Stopping(Exception):
    """The pool is shutting down: start nothing new."""


class Supervisor:
    """Owns the slots and the weight journal. `lock` guards slot state, the journal and `frozen`; no Ray call is
    awaited while it is held. Health checks run on one thread; each restart on a thread of its own."""

    def __init__(self, config: PoolConfig, router: Router) -> None:
        self.config = config
        self.router = router
        self.slots = [ReplicaSlot(i) for i in range(config.num_replicas)]
        self.counters = [SlotCounters() for _ in self.slots]  # per slot, carried over restarts (under `lock`)
        self.journal = WeightJournal()
        self.frozen = False
        self.lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mm-infer-replica-supervisor", daemon=True)
        self._restarting: dict[int, threading.Thread] = {}

    # start-up and restarts
    def _actor_class(self) -> Any:
        gpus = (self.config.num_gpus_per_replica or 0) * self.config.ranks  # every rank's device, on one node
        return ray.remote(num_cpus=self.config.num_cpus_per_replica * self.config.ranks, num_gpus=gpus, max_restarts=0,
                          max_concurrency=1000)(EngineReplica)

    def _spawn(self, slot: ReplicaSlot) -> Any:
        cfg = self.config
        with self.lock:
            if self._stop.is_set():
                raise _Stopping()
            slot.incarnation += 1
            slot.state = "starting"
            slot.applied_seq = -1
            slot.handle = self._actor_class().remote(slot.index, cfg.model_dir, dict(cfg.engine_options),
                                                     cfg.pins_cpus, cfg.stream_interval_s)
            return slot.handle.describe.remote()

    def _catch_up(self, slot: ReplicaSlot) -> None:
        """Apply the journal entries and pause state this incarnation lacks, outside the lock; mark it up under
        the lock once nothing changed meanwhile (a refit or pause that lands later reaches it by fan-out)."""
        frozen_applied: bool | None = None
        while True:
            with self.lock:
                pending = self.journal.since(slot.applied_seq)
                frozen = self.frozen
                if not pending and frozen_applied == frozen:
                    slot.state = "up"
                    self.router.set_up(slot.index, True)
                    return
            for entry in pending:
                ray.get(slot.handle.control.remote(UpdateWeights(entry.ref, entry.version)),
                        timeout=self.config.startup_timeout_s)
                slot.applied_seq = entry.seq
            ray.get(slot.handle.control.remote(Freeze(frozen)), timeout=self.config.health_timeout_s)
            frozen_applied = frozen

    def start_all(self) -> None:
        """Start every replica in parallel and wait until each has loaded the model; on failure kill them all."""
        for slot in self.slots:
            self.router.set_up(slot.index, False)
        try:  # a replica that cannot start at all (bad checkpoint, no device) fails the pool's start-up
            ready = [self._spawn(slot) for slot in self.slots]
            infos = ray.get(ready, timeout=self.config.startup_timeout_s)
            for slot, info in zip(self.slots, infos, strict=True):
                slot.info = info
                self._catch_up(slot)
        except BaseException:
            self.stop()
            raise
        self._thread.start()

    def _restart(self, slot: ReplicaSlot) -> None:
        try:
            slot.info = ray.get(self._spawn(slot), timeout=self.config.startup_timeout_s)
            self._catch_up(slot)
            slot.restarts += 1
            slot.failed_starts = 0
            if self._stop.is_set():  # stop() ran while this one started: it may have missed the new actor
                ray.kill(slot.handle, no_restart=True)
        except _Stopping:
            return
        except RayError as exc:  # could not start (yet): stay down, retry with exponential backoff (max 60 s)
            slot.failed_starts += 1
            slot.retry_at = time.monotonic() + restart_delay_s(slot.failed_starts)
            self.mark_down(slot.index, slot.incarnation, f"restart failed: {describe_failure(exc)}")
        except Exception:
            log.exception("replica %d: restart failed", slot.index)
            slot.retry_at = time.monotonic() + 60.0
            self.mark_down(slot.index, slot.incarnation, "restart failed (see the server log)")

    def _restart_later(self, slot: ReplicaSlot) -> None:
        """Start a restart thread for a down slot unless one runs or its backoff has not passed."""
        running = self._restarting.get(slot.index)
        if (running is not None and running.is_alive()) or time.monotonic() < slot.retry_at:
            return
        thread = threading.Thread(target=self._restart, args=(slot,), name=f"mm-infer-restart-{slot.index}",
                                  daemon=True)
        self._restarting[slot.index] = thread
        thread.start()

    # failures
    def mark_down(self, index: int, incarnation: int, reason: str) -> bool:
        """Take a replica out of routing and kill its actor; False if that incarnation is already gone."""
        with self.lock:
            slot = self.slots[index]
            if slot.incarnation != incarnation or slot.state == "down":
                return False
            slot.state = "down"
            slot.last_failure = reason
            self.router.set_up(index, False)
            handle = slot.handle
        if handle is not None:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # already gone
                pass
        self._wake.set()
        return True

    def _check(self, slot: ReplicaSlot) -> None:
        incarnation = slot.incarnation
        try:
            gauges = ray.get(slot.handle.ping.remote(), timeout=self.config.health_timeout_s)
        except GetTimeoutError:
            self.mark_down(slot.index, incarnation,
                           f"no answer to a health check within {self.config.health_timeout_s:g} s")
            return
        except RayError as exc:
            self.mark_down(slot.index, incarnation, f"health check failed: {describe_failure(exc)}")
            return
        slot.gauges = gauges
        with self.lock:
            self.counters[slot.index] = fold_reading(self.counters[slot.index], incarnation, gauges)
        if not gauges.get("alive", False):
            self.mark_down(slot.index, incarnation, "its engine loop stopped")
        elif gauges.get("stalled_s", 0.0) > self.config.stall_timeout_s:
            self.mark_down(slot.index, incarnation, f"its engine made no progress for {gauges['stalled_s']:.0f} s "
                           "with requests pending")

    def _run(self) -> None:
        while not self._stop.is_set():
            for slot in self.slots:
                if self._stop.is_set():
                    return
                try:
                    if slot.state == "up":
                        self._check(slot)
                    if slot.state == "down" and self.config.restart:
                        self._restart_later(slot)
                except Exception:  # the watcher must outlive any one replica's trouble
                    log.exception("replica %d: health check failed", slot.index)
            self._wake.wait(self.config.health_interval_s)
            self._wake.clear()

    def up_slots(self) -> list[ReplicaSlot]:
        with self.lock:
            return [s for s in self.slots if s.state == "up"]

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        for slot in self.slots:
            with self.lock:
                slot.state = "down"
                handle = slot.handle
            if handle is not None:
                try:
                    ray.kill(handle, no_restart=True)
                except Exception:
                    pass
