"""Bounded loopback load on `mm-infer serve` (image data URLs, tiny model), compared with LLM.generate on the same work.

    python scripts/bench/server_load.py --requests 200 --concurrency 32 --max-tokens 8
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from servers.openai.launch import free_port, wait_healthy

REPO = Path(__file__).resolve().parents[2]
IMAGES = ["photo.png", "photo.webp", "photo_q90.jpg", "gray.png", "rgba.png", "la.png", "exif_rotate90.jpg",
          "cmyk.jpg"]
MIME = {".png": "image/png", ".webp": "image/webp", ".jpg": "image/jpeg"}


def _payloads(args: argparse.Namespace) -> list[tuple[str, bytes]]:
    """(mime, bytes) per request; --distinct-media appends trailing bytes so no two requests share a cache entry."""
    files = [REPO / "assets" / "media" / "images" / name for name in IMAGES]
    out = []
    for i in range(args.requests):
        path = files[i % len(files)]
        data = path.read_bytes() + (i.to_bytes(8, "little") if args.distinct_media else b"")
        out.append((MIME[path.suffix], data))
    return out


def _body(i: int, urls: list[str], args: argparse.Namespace) -> dict:
    return {"max_tokens": args.max_tokens, "temperature": 0.0,  # no model: the one served (vLLM too)
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": urls[i]}},
                                                      {"type": "text", "text": f"Describe picture {i}."}]}],
            "mm_processor_kwargs": {"max_pixels": args.max_pixels}}


async def _load(base: str, args: argparse.Namespace) -> tuple[float, list[float], int]:
    urls = [f"data:{mime};base64,{base64.b64encode(data).decode()}" for mime, data in _payloads(args)]
    gate = asyncio.Semaphore(args.concurrency)
    latencies: list[float] = []
    tokens = [0]
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as c:
        async def one(i: int) -> None:
            async with gate:
                t0 = time.perf_counter()
                r = await c.post("/v1/chat/completions", json=_body(i, urls, args))
                r.raise_for_status()
                latencies.append(time.perf_counter() - t0)
                tokens[0] += r.json()["usage"]["completion_tokens"]

        await asyncio.gather(*(one(i) for i in range(min(8, args.requests))))  # warm-up, not timed
        latencies.clear()
        tokens[0] = 0
        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(args.requests)))
        return time.perf_counter() - start, latencies, tokens[0]


def _serve(args: argparse.Namespace, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "servers.cli", "serve", args.model, "--port", str(port),
                             "--num-kv-blocks", str(args.num_kv_blocks), "--log-level", "warning"], cwd=REPO, env=env)
    wait_healthy(proc, port, "server")
    return proc


def _offline(args: argparse.Namespace) -> float:
    from mm_infer import LLM, SamplingParams

    llm = LLM(args.model, num_kv_blocks=args.num_kv_blocks)
    prompts = [{"messages": [{"role": "user", "content": [{"type": "image"},
                                                           {"type": "text", "text": f"Describe picture {i}."}]}],
                "multi_modal_data": {"image": [data]}, "mm_processor_kwargs": {"max_pixels": args.max_pixels}}
               for i, (_, data) in enumerate(_payloads(args))]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    llm.generate(prompts[:8], params, use_tqdm=False)  # warm-up
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / "assets" / "models" / "tiny-qwen2-vl"))
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--max-pixels", type=int, default=50176)
    parser.add_argument("--num-kv-blocks", type=int, default=2048)
    parser.add_argument("--distinct-media", action="store_true", help="no media cache hits across requests")
    args = parser.parse_args()


    port = free_port()
    proc = _serve(args, port)
    try:
        wall, lat, tokens = asyncio.run(_load(f"http://127.0.0.1:{port}", args))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))]
    print(f"server: {args.requests} requests, concurrency {args.concurrency}, max_tokens {args.max_tokens}, "
          f"max_pixels {args.max_pixels}, distinct media {args.distinct_media}")
    print(f"server: {args.requests / wall:.2f} requests/s, {tokens / wall:.1f} generated tokens/s, "
          f"p50 {statistics.median(lat) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, wall {wall:.2f} s")
    offline = _offline(args)
    print(f"LLM.generate: {args.requests / offline:.2f} requests/s, wall {offline:.2f} s")
    print(f"ratio server/LLM.generate throughput: {offline / wall:.3f}")


if __name__ == "__main__":
    main()
