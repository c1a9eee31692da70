"""PackedTensor.pixel_values read from the public preprocess_images call against the fast path, in one run.

On --n distinct 1024x768 JPEGs at max_pixels 1003520 (grid 1x54x74: 18.8 MB of float32 rows each), ms per image,
each the best of --repeat rounds, the variants interleaved within a round so that load on the cores hits all alike:
  fast path: what media_uint8.py times as "ours to float32 rows": process_image(bytes, opts).pixel_values,
             one image at a time, EXIF off, torch at 1 thread;
  property:  preprocess_images(all the bytes, min_pixels=, max_pixels=).pixel_values, the public defaults (EXIF on,
             one call for the batch), at torch's default thread count, and again at 1 thread;
  and, to see where the time goes: uint8 frames alone (preprocess_images without reading pixel_values), and
  pixel_values alone from ready frames.
The two paths' rows are checked equal. Last line: `property_vs_fast=X.XX` (property ms / fast path ms, default threads).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: `scripts.*` imports as a package
from mm_infer.media import ImageOptions, preprocess_images, process_image  # noqa: E402
from scripts.bench.media import photographic_jpegs  # noqa: E402

MAX_PIXELS = 1003520
KW = {"min_pixels": 3136, "max_pixels": MAX_PIXELS}


def timed(fn: Callable[[], object], threads: int) -> float:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    finally:
        torch.set_num_threads(before)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    default_threads = torch.get_num_threads()
    jpegs = photographic_jpegs(args.n)
    opts = ImageOptions(exif_transpose=False, **KW)
    ready = preprocess_images(jpegs, **KW)
    fast_rows = torch.cat([process_image(b, opts).pixel_values for b in jpegs])
    assert torch.equal(ready.pixel_values, fast_rows), "the public call's rows differ from the fast path's"
    del fast_rows
    import mm_infer.media

    print(f"mm_infer from {Path(mm_infer.media.__file__).parents[1]}; {args.n} JPEGs 1024x768, grid "
          f"{ready.imgs_sizes[0].tolist()}; torch {torch.__version__}, default threads {default_threads} "
          f"(os.cpu_count {os.cpu_count()})")
    variants: dict[str, tuple[Callable[[], object], int]] = {
        "fast path (per image, EXIF off, 1 thread)": (lambda: [process_image(b, opts).pixel_values for b in jpegs], 1),
        f"property ({default_threads} threads)": (lambda: preprocess_images(jpegs, **KW).pixel_values, default_threads),
        "property (1 thread)": (lambda: preprocess_images(jpegs, **KW).pixel_values, 1),
        f"uint8 frames only ({default_threads} threads)": (lambda: preprocess_images(jpegs, **KW), default_threads),
        f"pixel_values from ready frames ({default_threads} threads)": (lambda: ready.pixel_values, default_threads),
        "pixel_values from ready frames (1 thread)": (lambda: ready.pixel_values, 1),
    }
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(args.repeat):
        for name, (fn, threads) in variants.items():
            best[name] = min(best[name], timed(fn, threads))
    ms = {name: t / args.n * 1e3 for name, t in best.items()}
    for name, v in ms.items():
        print(f"  {name:48s} {v:7.2f} ms per image")
    fast = ms["fast path (per image, EXIF off, 1 thread)"]
    print(f"property at 1 thread vs fast path: {ms['property (1 thread)'] / fast:.2f}x")
    print(f"property_vs_fast={ms[f'property ({default_threads} threads)'] / fast:.2f}")


if __name__ == "__main__":
    main()
