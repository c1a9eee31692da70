"""Benchmark half-type linear layers on the CPU: torch's GEMM vs float32 tiles, and the path chosen here; ratio LAST."""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from mm_infer.models import moe  # noqa: E402
from mm_infer.models.half_gemm_path import describe, forced_path, half_gemm_path  # noqa: E402
from mm_infer.models.half_linear import linear, path_taken  # noqa: E402

# one decoder layer of the 2B-shaped Qwen2-VL (hidden 1536, MLP 8960, 12 heads of 128, 2 KV heads): [out, in]
LAYER = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}


def best_ms_interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best-of-repeats milliseconds of each call, the calls taken in turn (one warm-up round first), so that a slow
    spell of the machine hits every candidate alike instead of the one timed during it."""
    best = {name: float("inf") for name in fns}
    for round_ in range(repeats + 1):
        for name, fn in fns.items():
            ms = 1e3 * timeit.timeit(fn, number=1)
            if round_:
                best[name] = min(best[name], ms)
    return best


def layer_call(fn: Callable, layers: list[dict[str, torch.Tensor]], rows: int) -> Callable[[], None]:
    """One call of `fn` over every layer's four projections at `rows` input rows (several layers, so that the
    weights stream from memory as in a decode step, not from the cache)."""
    inputs = {name: torch.randn(rows, w.shape[1]).to(w.dtype) for name, w in layers[0].items()}

    def once() -> None:
        for weights in layers:
            for name, w in weights.items():
                fn(inputs[name], w)

    return once


def experts_call(tokens: int, dtype: torch.dtype, path: str | None) -> Callable[[], object]:
    """16 experts' gate_up (30B-A3B shapes: [2*768, 2048]) over tokens spread evenly, through moe.grouped_linear with
    the half GEMM path forced (torch: the grouped GEMM; tiles: per-expert float32 tiles; None: as chosen here)."""
    w = (torch.randn(16, 2 * 768, 2048) * 0.02).to(dtype)  # [E, out, in]
    x = torch.randn(tokens, 2048).to(dtype)
    counts = torch.full((16,), tokens // 16, dtype=torch.long)

    def once() -> object:
        with forced_path(path):  # type: ignore[arg-type]
            return moe.grouped_linear(x, w, counts)

    return once


def tiles_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """half_linear.linear with the float32-tile path forced (rows below UPCAST_MIN_ROWS still take torch's GEMV)."""
    with forced_path("tiles"):
        return linear(x, w)


def report(name: str, times: dict[str, float]) -> float:
    """Print one line; return our dispatched linear's speed against the faster of torch and tiles (1.0: as fast)."""
    best = min(times["torch"], times["tiles"])
    share = best / times["ours"]
    print(f"{name}: torch {times['torch']:8.2f} ms  float32 tiles {times['tiles']:8.2f} ms  "
          f"ours ({times['path']}) {times['ours']:8.2f} ms  {share:.2f}x of the faster")
    return share


def layer_times(layers: list[dict[str, torch.Tensor]], rows: int, repeats: int) -> dict:
    """torch's F.linear, forced tiles, and half_linear.linear as it dispatches here, over the layers at `rows`."""
    some = next(iter(layers[0].values()))
    path = path_taken(torch.empty(rows, some.shape[1], dtype=some.dtype), some)
    fns = {"torch": F.linear, "tiles": tiles_linear, "ours": linear}
    calls = {name: layer_call(fn, layers, rows) for name, fn in fns.items()}
    return {**best_ms_interleaved(calls, repeats), "path": path}


def expert_times(tokens: int, repeats: int, dtype: torch.dtype) -> dict:
    """The grouped GEMM (torch path), per-expert tiles, and the path grouped_linear takes here."""
    calls = {name: experts_call(tokens, dtype, path) for name, path in (("torch", "torch"), ("tiles", "tiles"),
                                                                          ("ours", None))}
    return {**best_ms_interleaved(calls, repeats), "path": "tiles" if half_gemm_path(dtype) == "tiles" else "grouped"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", default="1,2,4,8,16,32,100,1024", help="input rows to time, comma-separated")
    parser.add_argument("--dtypes", default="bfloat16,float16", help="half types to time, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8,
                        help="distinct layers per call: 8 (0.75 GB in bf16) stream from memory, as a 2B decode does")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"cpu: {json.dumps(describe())}")
    print(f"{args.layers} 2B-shaped decoder layers' projections, {args.threads} threads, best of {args.repeats}, "
          "candidates timed in turn")
    shares = []
    with torch.inference_mode():
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            layers = [{name: (torch.randn(n, k) * k**-0.5).to(dtype) for name, (n, k) in LAYER.items()}
                      for _ in range(args.layers)]
            for rows in (int(r) for r in args.rows.split(",")):
                shares.append(report(f"{str(dtype)[6:]:8s} rows {rows:5d}", layer_times(layers, rows, args.repeats)))
            del layers
            if hasattr(F, "grouped_mm"):
                for tokens in (16, 128, 512):
                    shares.append(report(f"{str(dtype)[6:]:8s} MoE {tokens:4d} tokens/16 experts",
                                         expert_times(tokens, args.repeats, dtype)))
    print(f"chosen path against the faster of torch and float32 tiles, worst case: {min(shares):.2f}x")

if __name__ == "__main__":
    main()
