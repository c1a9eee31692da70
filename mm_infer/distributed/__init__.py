"""Scale-out on Ray: engine replicas as actors, a cache-aware router, health checks, and refit fan-out."""

from mm_infer.distributed.batch import generate_batch
from mm_infer.distributed.errors import ReplicaUnavailableError
from mm_infer.distributed.pool import ReplicaPool, ensure_ray
from mm_infer.distributed.router import Router, RouterStats, affinity_key
from mm_infer.distributed.slots import PoolConfig

__all__ = ["PoolConfig", "ReplicaPool", "ReplicaUnavailableError", "Router", "RouterStats", "affinity_key",
           "ensure_ray", "generate_batch"]
