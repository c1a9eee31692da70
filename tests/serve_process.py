"""`mm-infer serve` in a child process for tests: start it, wait until /health answers, stop it with SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def start_serve(args: list[str], port: int, timeout_s: float = 180.0,
                own_group: bool = False) -> tuple[subprocess.Popen, str]:
    """Run `python -m servers.cli serve ARGS --port PORT` and return it with its base URL once healthy (own_group: in
    a process group of its own, as a shell starts a job, so a test can signal the whole group)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "servers.cli", "serve", *args, "--port", str(port)], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=own_group)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    return proc, base
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.2)
    except BaseException:
        proc.kill()
        raise


def stop_serve(proc: subprocess.Popen, timeout_s: float = 60.0) -> str:
    """SIGTERM, wait, and return everything the process printed (killed and re-raised if it hangs)."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.stdout.read().decode()
