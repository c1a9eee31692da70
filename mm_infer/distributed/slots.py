"""ReplicaSlot: one replica position in the pool: its current actor, incarnation, health and last gauges."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

SlotState = Literal["starting", "up", "down"]


@dataclass(frozen=True)
class PoolConfig:
    """How many replicas of which model, where, and how they are watched."""

    model_dir: str
    num_replicas: int = 2
    engine_options: dict[str, Any] = field(default_factory=dict)
    ray_address: str | None = None  # None: use the running Ray, or start a local one
    pin_cpus: bool = True  # CPU replicas: replica i runs on core i (cores i*k.. for k ranks; mod the cores Ray may use)
    num_cpus_per_replica: float = 1.0
    num_gpus_per_replica: float | None = None  # None: 1 when the Ray cluster has GPUs, else 0 (CPU replicas)
    health_interval_s: float = 1.0
    health_timeout_s: float = 10.0
    stall_timeout_s: float = 120.0  # a replica with work whose engine made no progress this long is restarted
    startup_timeout_s: float = 300.0
    restart: bool = True
    spill_slack: int = 64  # a pinned replica may hold this many more sequences than the least loaded one
    stream_interval_s: float = 0.02  # replicas send at most one snapshot per request per interval
    media_cache_bytes: int = 1 << 30  # pixel values kept in the object store by content hash (LRU)

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {self.num_replicas}")

    @property
    def ranks(self) -> int:
        """Tensor-parallel ranks per replica: each replica reserves this many CPUs (or GPUs) on one node, where its
        rank 0 (the actor) starts the others as its own child processes."""
        return int(self.engine_options.get("tensor_parallel_size") or 1)

    @property
    def pins_cpus(self) -> bool:
        """CPU replicas pin themselves: replica i to core i modulo the cores of the node it runs on."""
        return self.pin_cpus and not (self.num_gpus_per_replica or 0) > 0


@dataclass
class ReplicaSlot:
    index: int
    handle: Any = None  # the Ray actor handle
    incarnation: int = 0  # bumped on every (re)start; a failure report for an older one is ignored
    state: SlotState = "starting"
    applied_seq: int = -1  # last weight-journal entry this incarnation applied
    info: dict[str, Any] = field(default_factory=dict)  # describe() of the current actor
    gauges: dict[str, Any] = field(default_factory=dict)  # last ping()
    restarts: int = 0
    last_failure: str | None = None
    failed_starts: int = 0  # consecutive restarts that failed: the next waits 2**failed_starts s (max 60)
    retry_at: float = 0.0  # time.monotonic() before which no restart is tried


def restart_delay_s(failed_starts: int) -> float:
    """Back-off before the next start after `failed_starts` failed starts in a row: 0, then 2, 4, ... 60 s (replica
    restarts and engine-core restarts alike)."""
    return 0.0 if failed_starts == 0 else min(2.0 ** failed_starts, 60.0)
