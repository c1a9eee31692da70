"""Benchmark: ReplicaPool throughput with 1 and 2 Ray replicas (one core each) on the same workload, same run.

The workload is GRPO-shaped: G groups x n separate requests, each group one distinct image, sampled at temperature
1 with ignore_eos. Prompts are prepared once up front (as a trainer passing token ids and media would), so the
figures are the replicas' scaling, plus the per-request costs the capacity model in docs/scaleout.md uses:
router pick, object-store put of a prepared request, and the pool round trip of a 1-token request.
Both pools stay up and runs alternate 1, 2, 1, 2, ...; prints tokens/s per run, the affinity hit rate, and the
median pairwise 2-vs-1 ratio LAST.
Usage: python scripts/bench/scaleout.py [--model DIR] [--groups 16] [--n 8] [--max-tokens 128] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
COLOURS = ["red", "green", "blue", "yellow", "purple", "orange", "cyan", "magenta", "brown", "pink", "gray", "navy"]


def images(count: int) -> list[bytes]:
    from PIL import Image, ImageDraw

    out = []
    for i in range(count):
        img = Image.new("RGB", (112, 112), "white")
        ImageDraw.Draw(img).rectangle((16 + i, 16, 96, 96 - i), fill=COLOURS[i % len(COLOURS)])
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def workload(pool, groups: int, n: int) -> list:
    prompts = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text":
                "Describe the shape and its colour."}]}], "multi_modal_data": {"image": [img]}}
               for img in images(groups)]
    prepared = [pool.prepare(p) for p in prompts]
    return [prepared[g] for g in range(groups) for _ in range(n)]


async def drive(pool, requests: list, max_tokens: int) -> tuple[float, int, list[int]]:
    from mm_infer.engine.sampling.params import SamplingParams

    async def one(i: int, req) -> tuple[int, int]:
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=i, ignore_eos=True)
        last = None
        async for out in pool.generate(req, params, f"bench-{time.monotonic_ns()}-{i}", stream=False):
            last = out
        return len(last.outputs[0].token_ids), last.extra["replica"]

    start = time.perf_counter()
    done = await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
    wall = time.perf_counter() - start
    return wall, sum(t for t, _ in done), [r for _, r in done]


def _mean_ms(fn, repeats: int) -> float:
    start = time.perf_counter()
    for i in range(repeats):
        fn(i)
    return (time.perf_counter() - start) / repeats * 1e3


def per_request_costs(pool, req) -> dict[str, float]:
    """What one request costs the router process (the figures docs/scaleout.md's capacity model uses):
    router decision, media put (new content hash), prompt preparation for a fresh image, the HTTP front end
    (/tokenize with an image data URL: parse, template, media cache hit, expansion), and the pool round trip of
    a 1-token request minus the replica's own engine time for it."""
    import base64

    import httpx

    from mm_infer.distributed.media_refs import MediaRefCache
    from mm_infer.distributed.router import Router
    from mm_infer.engine.sampling.params import SamplingParams
    from servers.openai.config import ServerConfig
    from servers.openai.launch import BackgroundServer, free_port
    from servers.openai.state import build_state

    router = Router(8)
    pick_us = _mean_ms(lambda i: router.release(router.pick(f"k{i % 512}", 1), 1), 20000) * 1e3
    cache, pixels = MediaRefCache(), req.items[0].media
    put_ms = _mean_ms(lambda i: cache._ref(f"fresh-{i}", pixels), 50)
    fresh = images(20)
    prepare_ms = _mean_ms(lambda i: pool.prepare({"messages": [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "Describe it."}]}], "multi_modal_data": {"image": [fresh[i]]}}), 20)

    async def overhead() -> float:
        params, total = SamplingParams(max_tokens=1), 0.0
        for i in range(20):
            start = time.perf_counter()
            async for out in pool.generate(req, params, f"rt-{time.monotonic_ns()}-{i}", stream=False):
                last = out
            engine = last.metrics.finished_time - last.metrics.arrival_time
            total += time.perf_counter() - start - engine
        return total / 20 * 1e3

    pool_ms = asyncio.run(overhead())
    config = ServerConfig(str(pool.config.model_dir), port=free_port())
    url = "data:image/png;base64," + base64.b64encode(fresh[0]).decode()
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                      {"type": "text", "text": "Describe it."}]}]}
    with BackgroundServer(config, build_state(config, backend=pool)) as srv, httpx.Client() as client:
        client.post(f"{srv.base_url}/tokenize", json=body).raise_for_status()
        http_ms = _mean_ms(lambda i: client.post(f"{srv.base_url}/tokenize", json=body).raise_for_status(), 50)
    return {"router_pick_us": pick_us, "media_put_ms": put_ms, "media_bytes": pixels.numel() * 4,
            "prepare_fresh_image_ms": prepare_ms, "http_front_end_ms": http_ms,
            "pool_overhead_ms": pool_ms}  # the server's exit shut the pool down: call this last


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "assets" / "models" / "tiny-qwen2-vl"))
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5, help="alternating timed runs per replica count")
    ap.add_argument("--max-num-seqs", type=int, default=16,
                    help="batch capacity of each replica (as KV memory caps it on a GPU); 0: unbounded")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    import ray

    from mm_infer.distributed import PoolConfig, ReplicaPool

    cores = len(os.sched_getaffinity(0))
    # logical CPUs for both pools at once (3 actors); physically each replica is pinned to its own core
    ray.init(num_cpus=max(cores, 2) + 1, include_dashboard=False, log_to_driver=False)
    options = {"cpu_threads": 1, "num_kv_blocks": 4096, "max_model_len": 2048}
    if args.max_num_seqs:
        options["max_num_seqs"] = args.max_num_seqs
    print(f"cores={cores} model={Path(args.model).name} groups={args.groups} n={args.n} "
          f"max_tokens={args.max_tokens} requests={args.groups * args.n} "
          f"max_num_seqs={args.max_num_seqs or 'unbounded'}")
    pools = {}
    for replicas in (1, 2):
        start = time.perf_counter()
        pools[replicas] = ReplicaPool(PoolConfig(args.model, replicas, options, health_interval_s=5.0))
        print(f"replicas={replicas} startup={time.perf_counter() - start:.1f}s")
    requests = workload(pools[1], args.groups, args.n)
    for pool in pools.values():
        asyncio.run(drive(pool, requests[: args.n], 4))  # warm-up: first-call costs out of the timing
    rates: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.repeats):  # alternate, so drifting load on a shared box hits both alike
        for replicas, pool in pools.items():
            cpu = time.process_time()  # this process is the router: its CPU per request bounds one router
            wall, tokens, where = asyncio.run(drive(pool, requests, args.max_tokens))
            cpu_ms = (time.process_time() - cpu) / len(requests) * 1e3
            rates[replicas].append(tokens / wall)
            split = [where.count(i) for i in range(replicas)]
            print(f"replicas={replicas} wall={wall:.2f}s tokens={tokens} tok/s={tokens / wall:.1f} split={split} "
                  f"router_cpu_ms_per_request={cpu_ms:.2f}")
    pairs = [two / one for one, two in zip(rates[1], rates[2], strict=True)]
    print("pairwise 2-vs-1 ratios: " + " ".join(f"{r:.2f}" for r in pairs))
    print(f"median tok/s: 1 replica {statistics.median(rates[1]):.1f}, 2 replicas {statistics.median(rates[2]):.1f}")
    hit_rate = pools[2].router.stats.hit_rate
    pools[1].shutdown()
    costs = per_request_costs(pools[2], requests[0])  # last: the server it starts shuts the pool down on exit
    pools[2].shutdown()
    print("per-request costs: " + " ".join(f"{k}={v:.3g}" for k, v in costs.items()))
    print(f"affinity_hit_rate={hit_rate:.3f} (n={args.n} groups)")
    ray.shutdown()
    print(f"scaleout_2_vs_1={statistics.median(pairs):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
