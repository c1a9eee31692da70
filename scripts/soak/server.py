"""The soak's server child: `mm-infer serve` on a free loopback port, its RSS, its /metrics and its log."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
API_KEY = "soak-key"


def start_server(model: str, num_kv_blocks: int, log_path: Path, max_model_len: int = 1024,
                 extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m servers.cli serve` in a child process on a free loopback port, its output to log_path."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    args = [sys.executable, "-m", "servers.cli", "serve", model, "--port", str(port), "--api-key", API_KEY,
            "--max-model-len", str(max_model_len), "--num-kv-blocks", str(num_kv_blocks), "--log-level", "warning",
            *extra]
    with log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(args, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log,
                                stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit(f"soak: FAIL (server did not come up)\n{log_path.read_text(errors='replace')[-3000:]}")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        out += [int(c) for c in task.read_text().split()]
    return out


def tree_rss_kib(pid: int) -> int:
    """VmRSS of `pid` and all its descendants (the engine core and template workers are children), in KiB."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += rss_kib(p)
            todo += _children(p)
        except (OSError, RuntimeError):  # a template worker killed at its deadline is gone between the reads
            if p == pid:
                raise
    return total


def rss_by_role(pid: int) -> dict[str, int]:
    """KiB per role in the server's tree: the server process, its engine core (every other descendant), and the
    template workers (`mm_infer.prompt.template_workers` children, killed and replaced at their deadlines)."""
    roles = {"server": rss_kib(pid), "engine core": 0, "template workers": 0}
    todo = _children(pid)
    while todo:
        p = todo.pop()
        try:
            worker = b"template_workers" in Path(f"/proc/{p}/cmdline").read_bytes()
            roles["template workers" if worker else "engine core"] += rss_kib(p)
            todo += _children(p)
        except (OSError, RuntimeError):  # gone between the reads
            pass
    return roles


async def read_metrics(client: httpx.AsyncClient) -> dict[str, float]:
    """The unlabelled samples of /metrics (gauges and plain counters)."""
    text = (await client.get("/metrics")).text
    out: dict[str, float] = {}
    for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*) (\S+)$", text, re.M):
        out[m.group(1)] = float(m.group(2))
    return out


async def settle(client: httpx.AsyncClient, timeout_s: float = 30.0) -> dict[str, float]:
    """Wait until nothing runs or waits in the server (aborted streams take a step to free), then the metrics."""
    deadline = time.monotonic() + timeout_s
    busy = ("mm_infer_requests_running", "mm_infer_num_sequences_running", "mm_infer_num_requests_waiting")
    while True:
        metrics = await read_metrics(client)
        if all(metrics.get(k, 0) == 0 for k in busy) or time.monotonic() > deadline:
            return metrics
        await asyncio.sleep(0.5)


def server_errors(log_path: Path) -> list[str]:
    """The last line of every traceback the server printed, counted."""
    lines = log_path.read_text(errors="replace").splitlines()
    counts: dict[str, int] = {}
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            j = i + 1
            while j < len(lines) and (lines[j].startswith(" ") or lines[j].startswith("Traceback")
                                      or not lines[j].strip() or lines[j].startswith("The above")
                                      or lines[j].startswith("During handling")):
                j += 1
            last = lines[j] if j < len(lines) else lines[-1]
            counts[last[:240]] = counts.get(last[:240], 0) + 1
    return [f"{n}x {text}" for text, n in sorted(counts.items(), key=lambda kv: -kv[1])]
