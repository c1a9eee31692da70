"""Scale-out on Ray: engine replicas as actors, a cache-aware router, health checks, and refit fan-out."""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {"generate_batch": "batch", "ReplicaUnavailableError": "errors", "ReplicaPool": "pool",
          "ensure_ray": "pool", "Router": "router", "RouterStats": "router", "affinity_key": "router",
          "PoolConfig": "slots"}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    """Ray is imported when the pool is first used, so the Ray-free parts (errors, journal) load without it."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
