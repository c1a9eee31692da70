"""Real RL clients against our server: one `mm-infer serve` subprocess (gloo weight transfer on) for the folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from client_cases import CKPT
from serve_process import start_serve, stop_serve

from servers.openai.launch import free_port

SERVE_ARGS = [str(CKPT), "--weight-transfer-config", '{"backend": "gloo"}', "--max-model-len", "2048",
              "--num-kv-blocks", "256"]


@pytest.fixture(scope="session")
def our_server() -> Iterator[str]:
    """Our server in its own process (the project venv), as a trainer's rollout workers would meet it."""
    proc, base = start_serve(SERVE_ARGS, free_port())
    yield base
    stop_serve(proc)
