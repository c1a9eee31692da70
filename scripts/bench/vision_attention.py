"""Qwen2.5-VL window attention: one SDPA call per window (the old path) against varlen_attention, same run.

Usage: python scripts/bench/vision_attention.py [--images 8] [--layers 4] [--threads 2]
Windows of 8 images of 1288x728 (Qwen2.5-VL-3B/7B tower: 16 heads of 80, window 112 px): ~75 windows per image
per layer, as `window_index` makes them. CPU float32 here; on CUDA bf16 (flash varlen where torch has it).
The last line is the speedup of varlen_attention over the per-window loop.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mm_infer.models.vision_ops import per_segment_attention, varlen_attention  # noqa: E402
from mm_infer.models.vision_qwen25 import window_index  # noqa: E402


def grid_for(width: int, height: int) -> list[int]:
    from mm_infer.media.resize import smart_resize

    h, w = smart_resize(height, width, 28, 56 * 56, 28 * 28 * 1280)
    return [1, h // 14, w // 14]


def math_per_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: list[int]) -> torch.Tensor:
    """The path before varlen_attention: 3-D SDPA per window (torch's math kernel on CPU)."""
    out = torch.empty_like(q)
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        qs, ks, vs = (x[start:end].transpose(0, 1) for x in (q, k, v))  # [H, L, d]
        out[start:end] = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs).transpose(0, 1)
    return out


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4, help="window-attention calls timed per repeat (one per layer)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    grid = [grid_for(1288, 728)] * args.images
    _, bounds = window_index(grid, 2, 112, 14)
    p = bounds[-1]
    q, k, v = (torch.randn(p, 16, 80, device=device, dtype=dtype) for _ in range(3))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def run(fn):
        def go() -> None:
            for _ in range(args.layers):
                fn(q, k, v, bounds)
            sync()
        return go

    old = timed(run(math_per_window), args.repeats)
    loop = timed(run(per_segment_attention), args.repeats)
    varlen = timed(run(varlen_attention), args.repeats)
    diff = varlen_attention(q, k, v, bounds).float() - per_segment_attention(q, k, v, bounds).float()
    err = float(diff.abs().max())
    print(f"{device} {dtype}: {args.images} images {grid[0]} -> {p} patches, {len(bounds) - 1} windows, "
          f"{args.layers} layers, {args.threads} threads; varlen vs 4-D per-window max |diff| {err:.1e}")
    print(f"3-D per-window loop (old) {old:.1f} ms, 4-D per-window loop {loop:.1f} ms, "
          f"varlen_attention {varlen:.1f} ms")
    print(f"varlen_attention vs the old per-window loop: {old / varlen:.2f}x")


if __name__ == "__main__":
    main()
