"""Benchmark bf16 linear layers on the CPU: torch's F.linear vs float32 tiles (models/half_linear.py), ratio LAST."""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mm_infer.models import moe  # noqa: E402
from mm_infer.models.half_linear import upcast_linear  # noqa: E402

# one decoder layer of the 2B-shaped Qwen2-VL (hidden 1536, MLP 8960, 12 heads of 128, 2 KV heads): [out, in]
LAYER = {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)}


def layer_ms(fn, weights: dict[str, torch.Tensor], rows: int, repeats: int) -> float:
    """Best-of-repeats milliseconds for the layer's four projections at `rows` input rows."""
    inputs = {name: torch.randn(rows, w.shape[1]).to(w.dtype) for name, w in weights.items()}

    def once() -> None:
        for name, w in weights.items():
            fn(inputs[name], w)

    return 1e3 * min(timeit.repeat(once, number=1, repeat=repeats + 1)[1:])


def experts_ms(tokens: int, repeats: int, grouped: bool) -> float:
    """Best-of-repeats ms of 16 experts' gate_up (30B-A3B shapes: [2*768, 2048]) over tokens spread evenly."""
    w = (torch.randn(16, 2 * 768, 2048) * 0.02).to(torch.bfloat16)  # [E, out, in]
    x = torch.randn(tokens, 2048).to(torch.bfloat16)
    counts = torch.full((16,), tokens // 16, dtype=torch.long)
    if grouped:  # torch's grouped GEMM, as the float32 and CUDA paths run it
        offs = counts.cumsum(0).to(torch.int32)
        fn = lambda: F.grouped_mm(x, w.transpose(1, 2), offs=offs)  # noqa: E731
    else:
        fn = lambda: moe.grouped_linear(x, w, counts)  # noqa: E731 - per-expert linear: tiles from 8 rows
    return 1e3 * min(timeit.repeat(fn, number=1, repeat=repeats + 1)[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", default="1,2,4,8,16,32,100,1024", help="input rows to time, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    weights = {name: (torch.randn(n, k) * k**-0.5).to(torch.bfloat16) for name, (n, k) in LAYER.items()}
    ratios = {}
    print(f"one 2B-shaped decoder layer's projections, bf16, {args.threads} threads, best of {args.repeats}")
    with torch.inference_mode():
        for rows in (int(r) for r in args.rows.split(",")):
            ours = layer_ms(upcast_linear, weights, rows, args.repeats)
            torch_ms = layer_ms(F.linear, weights, rows, args.repeats)
            x = torch.randn(rows, 1536).to(torch.bfloat16)
            diff = (upcast_linear(x, weights["gate_up"]).float() - F.linear(x, weights["gate_up"]).float()).abs()
            ratios[rows] = torch_ms / ours
            print(f"rows {rows:5d}: torch bf16 {torch_ms:9.2f} ms  float32 tiles {ours:9.2f} ms  "
                  f"({ratios[rows]:.2f}x)  max |diff| {diff.max().item():.3g}")
        if hasattr(F, "grouped_mm"):
            for tokens in (16, 128, 512):
                grouped, ours = experts_ms(tokens, args.repeats, True), experts_ms(tokens, args.repeats, False)
                print(f"MoE experts, {tokens:4d} tokens over 16: grouped_mm bf16 {grouped:8.2f} ms  per-expert tiles "
                      f"{ours:8.2f} ms ({grouped / ours:.2f}x)")
    big = [r for r in ratios if r >= 16]
    print(f"float32 tiles vs torch bf16, median over rows >= 16: {statistics.median(ratios[r] for r in big):.2f}x")


if __name__ == "__main__":
    main()
