"""Supervisor: starts replica actors, health-checks them, and restarts a dead one caught up to the weight version."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError

from mm_infer.distributed.errors import describe_failure
from mm_infer.distributed.journal import WeightJournal
from mm_infer.distributed.replica import EngineReplica
from mm_infer.distributed.router import Router
from mm_infer.distributed.slots import PoolConfig, ReplicaSlot

log = logging.getLogger(__name__)


class Supervisor:
    """Owns the slots and the weight journal. `lock` guards slot state, the journal and `frozen`; no Ray call is
    awaited while it is held, except the final catch-up check of a restart."""

    def __init__(self, config: PoolConfig, router: Router) -> None:
        self.config = config
        self.router = router
        self.slots = [ReplicaSlot(i) for i in range(config.num_replicas)]
        self.journal = WeightJournal()
        self.frozen = False
        self.lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mm-infer-replica-supervisor", daemon=True)

    # start-up and restarts
    def _actor_class(self) -> Any:
        gpus = self.config.num_gpus_per_replica or 0
        return ray.remote(num_cpus=self.config.num_cpus_per_replica, num_gpus=gpus, max_restarts=0,
                          max_concurrency=1000)(EngineReplica)

    def _spawn(self, slot: ReplicaSlot) -> Any:
        cfg = self.config
        with self.lock:
            slot.incarnation += 1
            slot.state = "starting"
            slot.applied_seq = -1
            slot.handle = self._actor_class().options(name=None).remote(
                slot.index, cfg.model_dir, dict(cfg.engine_options), cfg.cpu_for(slot.index), cfg.stream_interval_s)
            return slot.handle.describe.remote()

    def _catch_up(self, slot: ReplicaSlot) -> None:
        """Apply the journal entries this incarnation lacks, then mark it up (under the lock once nothing is left)."""
        while True:
            with self.lock:
                pending = self.journal.since(slot.applied_seq)
                if not pending:
                    ray.get(slot.handle.set_frozen.remote(self.frozen), timeout=self.config.health_timeout_s)
                    slot.state = "up"
                    self.router.set_up(slot.index, True)
                    return
            for entry in pending:
                ray.get(slot.handle.update_weights.remote(entry.ref, entry.version),
                        timeout=self.config.startup_timeout_s)
                slot.applied_seq = entry.seq

    def start_all(self) -> None:
        """Start every replica in parallel and wait until each has loaded the model."""
        for slot in self.slots:
            self.router.set_up(slot.index, False)
        ready = [self._spawn(slot) for slot in self.slots]
        infos = ray.get(ready, timeout=self.config.startup_timeout_s)
        for slot, info in zip(self.slots, infos, strict=True):
            slot.info = info
            self._catch_up(slot)
        self._thread.start()

    def _restart(self, slot: ReplicaSlot) -> None:
        if time.monotonic() < slot.retry_at:
            return
        try:
            slot.info = ray.get(self._spawn(slot), timeout=self.config.startup_timeout_s)
            self._catch_up(slot)
            slot.restarts += 1
            slot.failed_starts = 0
        except RayError as exc:  # could not start (yet): stay down, retry with exponential backoff (max 60 s)
            slot.failed_starts += 1
            slot.retry_at = time.monotonic() + min(2.0 ** slot.failed_starts, 60.0)
            self.mark_down(slot.index, slot.incarnation, f"restart failed: {describe_failure(exc)}")

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
        try:
            slot.gauges = ray.get(slot.handle.ping.remote(), timeout=self.config.health_timeout_s)
            if not slot.gauges.get("alive", False):
                self.mark_down(slot.index, slot.incarnation, "its engine loop stopped")
        except GetTimeoutError:
            self.mark_down(slot.index, slot.incarnation,
                           f"no answer to a health check within {self.config.health_timeout_s:g} s")
        except RayError as exc:
            self.mark_down(slot.index, slot.incarnation, f"health check failed: {describe_failure(exc)}")

    def _run(self) -> None:
        while not self._stop.is_set():
            for slot in self.slots:
                if self._stop.is_set():
                    return
                try:
                    if slot.state == "up":
                        self._check(slot)
                    if slot.state == "down" and self.config.restart:
                        self._restart(slot)
                except Exception:  # the watcher must outlive any one replica's trouble
                    log.exception("replica %d: health check or restart failed", slot.index)
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
            if slot.handle is not None:
                try:
                    ray.kill(slot.handle, no_restart=True)
                except Exception:
                    pass
