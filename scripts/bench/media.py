"""Benchmark the media pipeline against the HF Qwen2-VL PIL processor and against bare decoding.

Prints images/s for ours and HF (identical output asserted), our time per 1024x768 JPEG relative to
decoding it, threads vs processes for a parallel batch, and video sampling against decode-all.
Last line: `speedup_vs_hf=X.XX decode_ratio=Y.YY`.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import av
import numpy as np
import torch
from PIL import Image

from mm_infer.media import ImageOptions, preprocess_images, preprocess_videos, process_image
from mm_infer.media.sources import read_encoded
from mm_infer.media.video import decode_frames

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "assets" / "media" / "images"
PHOTOS = ["photo_q90.jpg", "photo.png", "photo.webp", "cmyk.jpg", "large_2000x1500.jpg", "exif_rotate90.jpg"]


def photographic_jpegs(n: int = 20, size: tuple[int, int] = (1024, 768)) -> list[bytes]:
    """n distinct 1024x768 JPEGs cut from the sample photographs (crops, flips, quality)."""
    sources = [Image.open(IMAGES / name).convert("RGB") for name in ("large_2000x1500.jpg", "photo.png", "cmyk.jpg")]
    out = []
    for i in range(n):
        src = sources[i % len(sources)]
        scale = 1.0 + 0.15 * (i % 4)
        big = src.resize((int(size[0] * scale), int(size[1] * scale)), Image.Resampling.BICUBIC)
        x0, y0 = (i * 37) % (big.width - size[0] + 1), (i * 53) % (big.height - size[1] + 1)
        img = big.crop((x0, y0, x0 + size[0], y0 + size[1]))
        if i % 2:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=85 + i % 10)
        out.append(buf.getvalue())
    return out


def best_time(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def hf_pil_processor(min_pixels: int, max_pixels: int):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)


def bench_images(items: list[bytes], kw: dict, repeat: int) -> tuple[float, float]:
    """(our images/s, HF images/s) on the PIL backend, after asserting identical pixel_values."""
    hf = hf_pil_processor(**kw)

    def run_hf() -> np.ndarray:
        return hf(images=[Image.open(io.BytesIO(b)) for b in items], return_tensors="np")["pixel_values"]

    def run_ours() -> torch.Tensor:
        return preprocess_images(items, backend="pil", exif_transpose=False, **kw).pixel_values

    assert np.array_equal(run_hf(), run_ours().numpy()), "outputs differ from the HF PIL processor"
    return len(items) / best_time(run_ours, repeat), len(items) / best_time(run_hf, repeat)


def _process_one(args: tuple[bytes, ImageOptions]) -> torch.Tensor:
    return process_image(args[0], args[1]).pixel_values


def bench_parallel(items: list[bytes], kw: dict, workers: int) -> tuple[float, float]:
    """(threads images/s, processes images/s) for the same batch and worker count."""
    opts = ImageOptions(min_pixels=kw["min_pixels"], max_pixels=kw["max_pixels"])
    jobs = [(b, opts) for b in items]
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(_process_one, jobs[:workers]))
        t_threads = best_time(lambda: list(pool.map(_process_one, jobs)), 3)
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(_process_one, jobs[:workers]))
        t_procs = best_time(lambda: list(pool.map(_process_one, jobs)), 3)
    return len(items) / t_threads, len(items) / t_procs


def make_clip(seconds: int = 10, fps: int = 30, size: tuple[int, int] = (640, 360)) -> bytes:
    """A camera pan over a photograph, H.264, the way a phone clip looks to a decoder."""
    photo = np.asarray(Image.open(IMAGES / "large_2000x1500.jpg").convert("RGB"))
    width, height = size
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(seconds * fps):
            x = i * (photo.shape[1] - width) // (seconds * fps)
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(photo[200 : 200 + height, x : x + width]), "rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def decode_all_then_sample(data: bytes, indices: list[int]) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return np.stack([frames[i] for i in indices])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-pixels", type=int, default=200704)
    args = parser.parse_args()
    torch.set_num_threads(1)
    kw = {"min_pixels": 3136, "max_pixels": args.max_pixels}

    photos = [(IMAGES / n).read_bytes() for n in PHOTOS]
    jpegs = photographic_jpegs()
    ours_p, hf_p = bench_images(photos, kw, args.repeat)
    ours_j, hf_j = bench_images(jpegs, kw, args.repeat)
    print(f"shared photos ({len(photos)}): ours {ours_p:.1f} img/s, HF PIL {hf_p:.1f} img/s, x{ours_p / hf_p:.2f}")
    print(f"1024x768 JPEGs ({len(jpegs)}): ours {ours_j:.1f} img/s, HF PIL {hf_j:.1f} img/s, x{ours_j / hf_j:.2f}")

    decode = best_time(lambda: [Image.open(io.BytesIO(b)).convert("RGB") for b in jpegs], args.repeat)
    ours_tv = best_time(lambda: preprocess_images(jpegs, exif_transpose=False, **kw), args.repeat)
    ours_pil = best_time(lambda: preprocess_images(jpegs, backend="pil", exif_transpose=False, **kw), args.repeat)
    print(f"per 1024x768 JPEG: decode {decode / len(jpegs) * 1e3:.2f} ms, ours torchvision backend "
          f"{ours_tv / len(jpegs) * 1e3:.2f} ms ({ours_tv / decode:.2f}x decode), pil backend "
          f"{ours_pil / len(jpegs) * 1e3:.2f} ms ({ours_pil / decode:.2f}x decode)")

    workers = max(2, os.cpu_count() or 2)
    torch.set_num_threads(1)
    threads, procs = bench_parallel(jpegs, kw, workers)
    print(f"parallel ({workers} workers): threads {threads:.1f} img/s, processes {procs:.1f} img/s")

    clip = make_clip()
    with av.open(io.BytesIO(clip)) as c:
        total = c.streams.video[0].frames
    _, (meta,) = preprocess_videos([clip], decoder="pyav")
    indices = meta.frame_indices
    t_all = best_time(lambda: decode_all_then_sample(clip, indices), args.repeat)
    encoded = read_encoded(clip)
    assert np.array_equal(decode_frames(encoded, indices, "pyav"), decode_all_then_sample(clip, indices))
    print(f"video 10 s 30 fps ({total} frames) -> {len(indices)} frames; decode-all then sample: {t_all * 1e3:.0f} ms")
    for decoder in ("pyav", "decord"):
        t_frames = best_time(lambda: decode_frames(encoded, indices, decoder), args.repeat)  # noqa: B023
        t_full = best_time(lambda: preprocess_videos([clip], decoder=decoder), args.repeat)  # noqa: B023
        print(f"  ours ({decoder}): sampled frames {t_frames * 1e3:.0f} ms (x{t_all / t_frames:.2f} vs decode-all), "
              f"whole pipeline to pixel_values {t_full * 1e3:.0f} ms")
    print(f"speedup_vs_hf={ours_j / hf_j:.2f} decode_ratio={ours_tv / decode:.2f}")


if __name__ == "__main__":
    sys.exit(main())
