"""Run the server: in the foreground (`mm-infer serve`) or on a background thread (tests, benchmarks)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from mm_infer.engine.runner.host_allocator import keep_step_memory
from mm_infer.environment import one_line
from servers.openai.app import build_app
from servers.openai.config import ServerConfig
from servers.openai.state import ServerState, build_state
from servers.openai.web.shutdown import DrainingServer
from servers.openai.web.slow_clients import event_loop, header_deadline_protocol


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_healthy(proc: Any, port: int, what: str, timeout_s: float = 180.0) -> None:
    """Wait for a server subprocess on `port` to answer /health with 200; kill it and raise if it never does."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{what} did not start")


def _uvicorn_config(state: ServerState, log_level: str) -> uvicorn.Config:
    cfg = state.config
    return uvicorn.Config(build_app(state), host=cfg.host, port=cfg.port, log_level=log_level,
                          timeout_graceful_shutdown=5, lifespan="on", loop=event_loop(),
                          http=header_deadline_protocol(cfg.header_timeout_s))


def serve(config: ServerConfig, log_level: str = "info") -> None:
    """Load the model and serve until interrupted (this process is the server's: glibc keeps its step memory)."""
    keep_step_memory()
    print(f"mm-infer: {one_line()}", flush=True)
    state = build_state(config)
    print(f"mm-infer: serving {config.model_name} on http://{config.host}:{config.port}", flush=True)
    DrainingServer(_uvicorn_config(state, log_level), state).run()


class BackgroundServer:
    """uvicorn on a daemon thread; `with BackgroundServer(config) as srv:` yields once it accepts requests."""

    def __init__(self, config: ServerConfig, state: ServerState | None = None) -> None:
        self.state = state or build_state(config)
        self.server = DrainingServer(_uvicorn_config(self.state, "warning"), self.state)
        self.thread = threading.Thread(target=self.server.run, name="mm-infer-server", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.state.config.host}:{self.state.config.port}"

    def start(self, timeout_s: float = 60.0) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
