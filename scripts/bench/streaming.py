"""Streamed long outputs through `mm-infer serve`: this checkout against another one (e.g. an earlier commit).

Both servers serve the same tiny checkpoint; runs alternate (this, baseline, this, ...). Each run streams
`--requests` chat completions of `--max-tokens` tokens (ignore_eos) at `--concurrency`, and the server
process's CPU seconds are read from /proc. The last line is the median of the pairwise throughput ratios.

    git worktree add /tmp/mm-base <commit>
    python scripts/bench/streaming.py --baseline /tmp/mm-base --max-tokens 1000 [--tool-parser hermes]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from servers.openai.launch import free_port, wait_healthy

REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "assets" / "models" / "tiny-qwen2-vl"


def _serve(tree: Path, port: int, args: argparse.Namespace) -> subprocess.Popen:
    entry = "servers.cli" if (tree / "servers" / "cli.py").exists() else "mm_infer.cli"  # before/after the move
    cmd = [sys.executable, "-m", entry, "serve", str(CKPT), "--port", str(port), "--num-kv-blocks",
           str(args.num_kv_blocks), "--max-model-len", str(args.max_tokens + 64), "--log-level", "warning"]
    cmd += ["--tool-parser", args.tool_parser] if args.tool_parser else []
    cmd += ["--reasoning-parser", args.reasoning_parser] if args.reasoning_parser else []
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, cwd=tree, env=env)
    wait_healthy(proc, port, f"server from {tree}")
    return proc


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def _load(base: str, args: argparse.Namespace) -> tuple[float, int]:
    body = {"messages": [{"role": "user", "content": "Tell me a long story."}],  # no model: the one served
            "max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True,
            "logprobs": True}
    if args.tool_parser:  # the parser runs on a request that offers tools
        body["tools"] = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                                           "parameters": {"type": "object", "properties": {
                                                               "word": {"type": "string"}}}}}]
    sem = asyncio.Semaphore(args.concurrency)
    tokens = [0]

    async def one(client: httpx.AsyncClient) -> None:
        async with sem, client.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=600) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:]).get("choices", []):
                        tokens[0] += len((choice.get("logprobs") or {}).get("content") or [])

    async with httpx.AsyncClient() as client:
        start = time.perf_counter()
        await asyncio.gather(*(one(client) for _ in range(args.requests)))
        return time.perf_counter() - start, tokens[0]


def _run(tree: Path, port: int, args: argparse.Namespace) -> tuple[float, float]:
    """(output tokens/s, server CPU seconds per 1000 tokens) of one run against a fresh server from `tree`."""
    proc = _serve(tree, port, args)
    try:
        asyncio.run(_load(f"http://127.0.0.1:{port}", argparse.Namespace(**{**vars(args), "requests": 2})))
        cpu0 = _cpu_seconds(proc.pid)
        wall, tokens = asyncio.run(_load(f"http://127.0.0.1:{port}", args))
        cpu = _cpu_seconds(proc.pid) - cpu0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert tokens == args.requests * args.max_tokens, f"{tree}: {tokens} tokens streamed"
    return tokens / wall, 1000 * cpu / tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="another checkout of mm-infer to compare with")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=1000)
    ap.add_argument("--num-kv-blocks", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tool-parser", default=None, help="e.g. hermes: requests then carry a tool")
    ap.add_argument("--reasoning-parser", default=None, help="e.g. qwen3")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))

    ours, base = [], []
    for r in range(args.repeats):
        ours.append(_run(REPO, free_port(), args))
        base.append(_run(args.baseline, free_port(), args))
        print(f"run {r + 1}: this {ours[-1][0]:.0f} tok/s ({ours[-1][1]:.3f} cpu-s/1k tok), baseline "
              f"{base[-1][0]:.0f} tok/s ({base[-1][1]:.3f} cpu-s/1k tok)", flush=True)
    ratios = [o[0] / b[0] for o, b in zip(ours, base, strict=True)]
    cpu = [b[1] / o[1] for o, b in zip(ours, base, strict=True)]
    parsers = f", tool parser {args.tool_parser}" if args.tool_parser else ""
    parsers += f", reasoning parser {args.reasoning_parser}" if args.reasoning_parser else ""
    print(f"{args.requests} streams x {args.max_tokens} tokens, concurrency {args.concurrency}, logprobs on{parsers}")
    print(f"server cpu per token, baseline/this (median): {statistics.median(cpu):.2f}")
    print(f"streaming_throughput_this_vs_baseline={statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
