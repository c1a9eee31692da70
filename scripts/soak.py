"""Bounded loopback soak: mixed and hostile traffic, one pause/resume and one refit against a real `mm-infer serve`."""

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
from dataclasses import dataclass
from pathlib import Path

import httpx
from soak_client import Tally, count, send
from soak_server import API_KEY, REPO, rss_kib, server_errors, settle, start_server
from soak_traffic import CHAT, HOSTILE, NORMAL, Req, chat_body, hostile, make_pool, normal, pick

CKPT = REPO / "assets" / "models" / "tiny-qwen2-vl"
KV_FREE, KV_TOTAL = "mm_infer_kv_blocks_free", "mm_infer_kv_blocks_total"
RSS_LIMIT_PCT = 5.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hostile-share", type=float, default=0.3, help="fraction of requests that are hostile")
    p.add_argument("--pause-mode", choices=["abort", "wait", "random"], default="random")
    p.add_argument("--model", default=str(CKPT))
    p.add_argument("--num-kv-blocks", type=int, default=256)
    p.add_argument("--warmup-minutes", type=float, default=None,
                   help="mixed traffic before the RSS baseline (default: 10%% of --minutes, 0.25 to 1)")
    p.add_argument("--images", type=int, default=32, help="size of the fixed pool of distinct images")
    p.add_argument("--no-keepalive", action="store_true",
                   help="a new connection per request (tells lost answers from races on reused connections)")
    p.add_argument("--keep-log", action="store_true", help="keep the server log file")
    args = p.parse_args(argv)
    if args.warmup_minutes is None:
        args.warmup_minutes = min(1.0, max(0.25, args.minutes / 10))
    return args


async def warm_up(client: httpx.AsyncClient, tally: Tally, args: argparse.Namespace) -> None:
    """Every pool image, every normal kind twice and every hostile kind once, then --warmup-minutes of mixed
    traffic: RSS is measured after first-use allocations and after the server's bounded caches (media, encoder,
    prefix) have seen the whole working set."""
    rng = random.Random(f"{args.seed}-warm")
    reqs = [normal(k, rng) for k in NORMAL for _ in range(2)] + [hostile(k, rng) for k in HOSTILE]
    reqs += [Req("chat_image", CHAT, json.dumps(chat_body(rng, url=url)).encode())
             for url in make_pool(args.seed, args.images)]
    gate = asyncio.Semaphore(args.concurrency)

    async def one(req: Req) -> None:
        async with gate:
            tally.record(req, await send(client, req))
    await asyncio.gather(*(one(r) for r in reqs))
    deadline = time.monotonic() + 60 * args.warmup_minutes
    await asyncio.gather(*(worker(client, tally, random.Random(f"{args.seed}-warm-{w}"), deadline, args.hostile_share)
                           for w in range(args.concurrency)))


async def worker(client: httpx.AsyncClient, tally: Tally, rng: random.Random, deadline: float, share: float) -> None:
    while time.monotonic() < deadline:
        req = pick(rng, share)
        tally.record(req, await send(client, req))


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
    t0, rss = time.monotonic(), rss_kib(pid)
    resp = await client.post("/update_weights_from_disk", json={"model_path": model})
    log.append(f"/update_weights_from_disk at {t0 - tally.start:.2f}-{time.monotonic() - tally.start:.2f}s -> "
               f"{resp.status_code} {resp.text[:200]} (server rss {rss / 1024:.1f} -> {rss_kib(pid) / 1024:.1f} MiB)")
    return log


async def sample_rss(pid: int, run_s: float, every: int = 6) -> list[int]:
    """The server's RSS (KiB) `every` times during the run: a plateau is a cache filling, a ramp is a leak."""
    out = []
    for _ in range(every):
        await asyncio.sleep(run_s / every)
        out.append(rss_kib(pid))
    return out


@dataclass
class Result:
    tally: Tally
    rss: tuple[int, int]  # KiB after warm-up, KiB at the end
    rss_samples: list[int]
    metrics: dict[str, float]
    control: list[str]
    elapsed: float

    @property
    def growth_pct(self) -> float:
        return 100.0 * (self.rss[1] - self.rss[0]) / self.rss[0]


async def run(args: argparse.Namespace, proc: subprocess.Popen[bytes], base: str) -> Result:
    """Warm up, take the RSS baseline, run the workers and the control task until the deadline, then settle."""
    tally = Tally()
    headers = {"Authorization": f"Bearer {API_KEY}"}
    keep = 0 if args.no_keepalive else args.concurrency + 4
    limits = httpx.Limits(max_connections=args.concurrency + 4, max_keepalive_connections=keep)
    fresh = httpx.Limits(max_keepalive_connections=0)  # control and metrics: a new connection per call
    async with (httpx.AsyncClient(base_url=base, headers=headers, timeout=180, limits=limits) as client,
                httpx.AsyncClient(base_url=base, headers=headers, timeout=180, limits=fresh) as admin):
        await warm_up(client, tally, args)
        await settle(admin)
        rss0 = rss_kib(proc.pid)
        mode = args.pause_mode if args.pause_mode != "random" else random.Random(args.seed).choice(["abort", "wait"])
        run_s, t_start = args.minutes * 60, time.monotonic()
        deadline = t_start + run_s
        ctl = asyncio.create_task(control(admin, tally, run_s, mode, args.model, proc.pid))
        samples = asyncio.create_task(sample_rss(proc.pid, run_s))
        await asyncio.gather(*(worker(client, tally, random.Random(f"{args.seed}-{w}"), deadline, args.hostile_share)
                               for w in range(args.concurrency)))
        control_log = await ctl
        elapsed = time.monotonic() - t_start
        metrics = await settle(admin)
        rss1 = rss_kib(proc.pid)
    return Result(tally, (rss0, rss1), await samples, metrics, control_log, elapsed)


def verdict(res: Result, alive: bool) -> tuple[bool, str]:
    """PASS: no lost answer, no 5xx, RSS growth under RSS_LIMIT_PCT, every KV block free, control calls 200."""
    tally, metrics, growth = res.tally, res.metrics, res.growth_pct
    bad_control = [c for c in res.control if " -> 200 " not in c]
    reasons = [f"{count(tally.lost)} lost", f"{count(tally.fivexx)} 5xx", f"rss {growth:+.1f}%"]
    ok = not tally.lost and not tally.fivexx and growth < RSS_LIMIT_PCT and alive and not bad_control
    if KV_FREE in metrics and KV_TOTAL in metrics:
        free, total = int(metrics[KV_FREE]), int(metrics[KV_TOTAL])
        reasons.append(f"kv {free}/{total} free")
        ok = ok and free == total
    else:
        reasons.append(f"kv gauges missing ({KV_FREE}, {KV_TOTAL})")
        ok = False
    if bad_control:
        reasons.append(f"{len(bad_control)} control calls failed")
    if not alive:
        reasons.append("server died")
    return ok, f"soak: {'PASS' if ok else 'FAIL'} ({', '.join(reasons)})"


def print_bucket(title: str, bucket: dict[str, list[str]], examples: int = 3) -> None:
    """Each distinct outcome once, with its count and up to `examples` distinct requests that caused it."""
    print(f"{title}: {count(bucket)}")
    for key, reqs in sorted(bucket.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(reqs)}x {key}")
        seen: dict[str, str] = {}
        for r in reqs:
            seen.setdefault(r.split(": ", 1)[1], r)
        for r in list(seen.values())[:examples]:
            print(f"      {r}")


def report(args: argparse.Namespace, res: Result, errors: list[str]) -> None:
    tally, metrics, (rss0, rss1) = res.tally, res.metrics, res.rss
    print(f"minutes: {res.elapsed / 60:.2f} (asked {args.minutes}), concurrency {args.concurrency}, "
          f"seed {args.seed}, hostile share {args.hostile_share}, warm-up {args.warmup_minutes:g} min")
    print(f"requests sent: {sum(tally.sent.values())} (warm-up included)")
    for kind, n in sorted(tally.sent.items()):
        print(f"  {kind:26s} {n}")
    print("responses by status: " + ", ".join(f"{s}: {n}" for s, n in sorted(tally.statuses.items())))
    print(f"expected 503 aborts (in flight during /pause abort): {tally.expected_aborts}")
    print("(times: seconds since the soak began, warm-up included)")
    for line in res.control:
        print(f"control: {line}")
    print_bucket("hostile requests answered 200 (listed, not a failure)", tally.hostile_accepted)
    print_bucket("lost answers", tally.lost)
    print_bucket("5xx answers", tally.fivexx)
    print(f"server tracebacks: {len(errors)} distinct" + "".join(f"\n  {e}" for e in errors[:20]))
    kv = (f"{int(metrics[KV_FREE])}/{int(metrics[KV_TOTAL])}" if KV_FREE in metrics and KV_TOTAL in metrics
          else f"not exposed (expected gauges {KV_FREE} and {KV_TOTAL})")
    print(f"kv blocks free/total at end: {kv}")
    print(f"server rss: start {rss0 / 1024:.1f} MiB, end {rss1 / 1024:.1f} MiB, "
          f"growth {res.growth_pct:+.2f}%; during the run (MiB): "
          + " ".join(f"{k / 1024:.1f}" for k in res.rss_samples))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    fd, name = tempfile.mkstemp(prefix="soak-server-", suffix=".log")
    os.close(fd)
    log_path = Path(name)
    proc, base = start_server(args.model, args.num_kv_blocks, log_path)
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
    ok, line = verdict(res, alive)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
