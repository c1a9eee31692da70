"""Replica-test fixtures: one local Ray for the session (the CI machine's 2 cores, offered as 4 CPU slots so that 2
replicas of 2 tensor-parallel ranks each fit)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray


@pytest.fixture(scope="session")
def local_ray() -> Iterator[None]:
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def two_replica_server(local_ray: None) -> Iterator[object]:
    """A server over 2 Ray replicas of the tiny checkpoint (128 KV blocks each), for one test module."""
    from replica_cases import CKPT, OPTIONS

    from servers.openai.config import ServerConfig
    from servers.openai.launch import BackgroundServer, free_port

    srv = BackgroundServer(ServerConfig(model_dir=str(CKPT), port=free_port(), replicas=2,
                                        engine_options={**OPTIONS, "num_kv_blocks": 128})).start()
    yield srv
    srv.stop()
