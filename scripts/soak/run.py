"""Bounded loopback soak: mixed and hostile traffic, one pause/resume and one refit against a real `mm-infer serve`.

--hostile adds the turn-3 kinds (poisoned inline features, template bombs, huge schemas, long prompts, huge n), each
with the statuses it must get; the verdict is the same: 0 lost, 0 innocent failures, bounded RSS."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: `scripts.*` imports as a package
from scripts.soak import hostile as soak_hostile  # noqa: E402
from scripts.soak.client import Tally, send  # noqa: E402
from scripts.soak.report import Result, report, verdict  # noqa: E402
from scripts.soak.server import (  # noqa: E402
    API_KEY,
    REPO,
    rss_by_role,
    rss_kib,
    server_errors,
    settle,
    start_server,
    tree_rss_kib,
)
from scripts.soak.traffic import CHAT, NORMAL, Mix, Req, chat_body, make_pool, normal, pick  # noqa: E402

CKPT = REPO / "assets" / "models" / "tiny-qwen2-vl"
RSS_PERIOD_S = 0.5
CLIENT_TIMEOUT_S = 300  # a --hostile huge-n answer takes ~2 minutes on 2 busy CPU cores


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hostile-share", type=float, default=0.3, help="fraction of requests that are hostile")
    p.add_argument("--pause-mode", choices=["abort", "wait", "random"], default="random")
    p.add_argument("--model", default=str(CKPT))
    p.add_argument("--num-kv-blocks", type=int, default=None,
                   help=f"default 256, with --hostile {soak_hostile.NUM_KV_BLOCKS}")
    p.add_argument("--hostile", action="store_true",
                   help="add the turn-3 kinds (a server with --max-model-len "
                        f"{soak_hostile.MAX_MODEL_LEN} and {' '.join(soak_hostile.SERVER_FLAGS)})")
    p.add_argument("--rss-scope", choices=["server", "tree", "processes"], default="server",
                   help="what the RSS limit holds: the server process; it with its engine core and workers summed; "
                        "or the server and the engine core each (template workers: within their memory cap)")
    p.add_argument("--long-prompt-tokens", type=int, default=soak_hostile.LONG_PROMPT_TOKENS,
                   help="the --hostile long prompt's length in token ids")
    p.add_argument("--warmup-minutes", type=float, default=None,
                   help="mixed traffic before the RSS baseline (default: 10%% of --minutes, 0.25 to 1)")
    p.add_argument("--images", type=int, default=32, help="size of the fixed pool of distinct images")
    p.add_argument("--no-keepalive", action="store_true",
                   help="a new connection per request (tells lost answers from races on reused connections)")
    p.add_argument("--keep-log", action="store_true", help="keep the server log file")
    args = p.parse_args(argv)
    if args.warmup_minutes is None:
        args.warmup_minutes = min(1.0, max(0.25, args.minutes / 10))
    if args.num_kv_blocks is None:
        args.num_kv_blocks = soak_hostile.NUM_KV_BLOCKS if args.hostile else 256
    args.mix = soak_hostile.hostile_mix(args.long_prompt_tokens) if args.hostile else Mix()
    return args


async def warm_up(client: httpx.AsyncClient, tally: Tally, args: argparse.Namespace) -> None:
    """Every pool image, every normal kind twice and every hostile kind once, then --warmup-minutes of mixed
    traffic: RSS is measured after first-use allocations and after the server's bounded caches (media, encoder,
    prefix) have seen the whole working set."""
    rng = random.Random(f"{args.seed}-warm")
    pool = make_pool(args.seed, args.images)
    if args.hostile:
        await soak_hostile.prime_renders(client, tally, args.seed)
    reqs = [normal(k, rng) for k in NORMAL for _ in range(2)] + [args.mix.make(k, rng) for k in args.mix.kinds]
    reqs += [Req("chat_image", CHAT, json.dumps(chat_body(rng, url=url)).encode()) for url in pool]
    gate = asyncio.Semaphore(args.concurrency)

    async def one(req: Req) -> None:
        async with gate:
            tally.record(req, await send(client, req))
    await asyncio.gather(*(one(r) for r in reqs))
    deadline = time.monotonic() + 60 * args.warmup_minutes
    busy: set[str] = set()
    await asyncio.gather(*(worker(client, tally, random.Random(f"{args.seed}-warm-{w}"), deadline, args, busy)
                           for w in range(args.concurrency)))


async def worker(client: httpx.AsyncClient, tally: Tally, rng: random.Random, deadline: float,
                 args: argparse.Namespace, busy: set[str]) -> None:
    """Requests until the deadline; a heavy kind is drawn only while no other worker has one of it in flight."""
    mix: Mix = args.mix
    while time.monotonic() < deadline:
        req = pick(rng, args.hostile_share, mix, busy)
        heavy = req.kind in mix.heavy
        if heavy:
            busy.add(req.kind)
        try:
            tally.record(req, await send(client, req))
        finally:
            if heavy:
                busy.discard(req.kind)


async def control(client: httpx.AsyncClient, tally: Tally, run_s: float, mode: str, model: str,
                  pid: int) -> list[str]:
    """One /pause + /resume at 35% of the run and one refit with the same weights at 65%; a line per call."""
    log: list[str] = []
    start = time.monotonic()
    await asyncio.sleep(run_s * 0.35)
    t0 = time.monotonic()
    if mode == "abort":
        tally.abort_window = (t0, float("inf"))  # aborted answers come back before /pause itself answers
    resp = await client.post("/pause", json={"mode": mode})
    if mode == "abort":
        tally.abort_window = (t0, time.monotonic())
    log.append(f"/pause {mode} at {t0 - tally.start:.2f}-{time.monotonic() - tally.start:.2f}s -> "
               f"{resp.status_code} {resp.text[:200]}")
    await asyncio.sleep(1.5)
    t0 = time.monotonic()
    resp = await client.post("/resume")
    log.append(f"/resume at {t0 - tally.start:.2f}s -> {resp.status_code} {resp.text[:200]}")
    await asyncio.sleep(max(0.0, start + run_s * 0.65 - time.monotonic()))
    t0, rss = time.monotonic(), tree_rss_kib(pid)
    resp = await client.post("/update_weights_from_disk", json={"model_path": model})
    log.append(f"/update_weights_from_disk at {t0 - tally.start:.2f}-{time.monotonic() - tally.start:.2f}s -> "
               f"{resp.status_code} {resp.text[:200]} (server rss {rss / 1024:.1f} -> "
               f"{tree_rss_kib(pid) / 1024:.1f} MiB)")
    return log


async def sample_rss(pid: int, out: list[int]) -> None:
    """The server tree's RSS (KiB) every RSS_PERIOD_S into `out` until cancelled: a plateau is a cache filling, a
    ramp is a leak, a spike is one request's working set."""
    while True:
        out.append(tree_rss_kib(pid))
        await asyncio.sleep(RSS_PERIOD_S)


async def run(args: argparse.Namespace, proc: subprocess.Popen[bytes], base: str) -> Result:
    """Warm up, take the RSS baseline, run the workers and the control task until the deadline, then settle."""
    tally = Tally(probe=lambda: tree_rss_kib(proc.pid))
    headers = {"Authorization": f"Bearer {API_KEY}"}
    keep = 0 if args.no_keepalive else args.concurrency + 4
    limits = httpx.Limits(max_connections=args.concurrency + 4, max_keepalive_connections=keep)
    fresh = httpx.Limits(max_keepalive_connections=0)  # control and metrics: a new connection per call
    samples: list[int] = []
    watch = asyncio.create_task(sample_rss(proc.pid, samples))
    async with (httpx.AsyncClient(base_url=base, headers=headers, timeout=CLIENT_TIMEOUT_S, limits=limits) as client,
                httpx.AsyncClient(base_url=base, headers=headers, timeout=CLIENT_TIMEOUT_S, limits=fresh) as admin):
        await warm_up(client, tally, args)
        await settle(admin)
        rss0, own0, warm, roles0 = tree_rss_kib(proc.pid), rss_kib(proc.pid), len(samples), rss_by_role(proc.pid)
        mode = args.pause_mode if args.pause_mode != "random" else random.Random(args.seed).choice(["abort", "wait"])
        run_s, t_start = args.minutes * 60, time.monotonic()
        deadline = t_start + run_s
        ctl = asyncio.create_task(control(admin, tally, run_s, mode, args.model, proc.pid))
        busy: set[str] = set()
        await asyncio.gather(*(worker(client, tally, random.Random(f"{args.seed}-{w}"), deadline, args, busy)
                               for w in range(args.concurrency)))
        control_log = await ctl
        elapsed = time.monotonic() - t_start
        metrics = await settle(admin)
        rss1, own1, roles1 = tree_rss_kib(proc.pid), rss_kib(proc.pid), rss_by_role(proc.pid)
    watch.cancel()
    return Result(tally, (rss0, rss1), (own0, own1), samples[warm:], max(samples[:warm], default=rss0), metrics,
                  control_log, elapsed, (roles0, roles1))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    fd, name = tempfile.mkstemp(prefix="soak-server-", suffix=".log")
    os.close(fd)
    log_path = Path(name)
    extra = (soak_hostile.MAX_MODEL_LEN, soak_hostile.SERVER_FLAGS) if args.hostile else ()
    proc, base = start_server(args.model, args.num_kv_blocks, log_path, *extra)
    try:
        res = asyncio.run(run(args, proc, base))
        alive = proc.poll() is None
    except (httpx.HTTPError, OSError) as exc:  # the server went away under the soak
        print(log_path.read_text(errors="replace")[-3000:])
        print(f"server log: {log_path}")
        print(f"soak: FAIL (server unreachable: {type(exc).__name__}: {exc}; exit code {proc.poll()})")
        return 1
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    report(args, res, server_errors(log_path))
    if args.keep_log:
        print(f"server log: {log_path}")
    else:
        log_path.unlink(missing_ok=True)
    ok, line = verdict(res, alive, args.rss_scope)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
