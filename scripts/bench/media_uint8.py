"""Bytes -> uint8 frames ready for the device vs bare decode vs float32 rows (and HF's fast processor beside it).

On 20 distinct 1024x768 JPEGs at max_pixels 1003520, one thread: ms per image for bare decode, ours to uint8
frames (what the engine now ships), ours to float32 rows (the old output, still `pixel_values`), and, when a
python with transformers + torchvision is given (default: the vLLM peer venv), HF's fast Qwen2-VL processor with
its output's sha256 checked against our rows. Also bytes per item and the Ray object-store payload per item.
Last line: `frames_vs_decode=X.XX rows_vs_decode=Y.YY hf_vs_frames=Z.ZZ bytes_ratio=W.WW`.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the checkout: `scripts.*` imports as a package

from mm_infer.distributed.media_refs import _media_to_store, _to_store  # noqa: E402
from mm_infer.media import ImageOptions, process_image  # noqa: E402
from scripts.bench.media import best_time, photographic_jpegs  # noqa: E402

MAX_PIXELS = 1003520
PEER = REPO / ".peers" / "vllm-venv" / "bin" / "python"
HF_SNIPPET = """
import hashlib, io, json, sys, time, numpy as np, torch
from pathlib import Path
from PIL import Image
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
torch.set_num_threads(1)
files = sorted(Path(sys.argv[1]).glob("*.jpg"))
data = [f.read_bytes() for f in files]
proc = Qwen2VLImageProcessor(min_pixels=3136, max_pixels=int(sys.argv[2]))
def run():
    return [proc(images=[Image.open(io.BytesIO(b)).convert("RGB")], return_tensors="pt")["pixel_values"] for b in data]
out = run()
best = float("inf")
for _ in range(int(sys.argv[3])):
    t0 = time.perf_counter(); run(); best = min(best, time.perf_counter() - t0)
sha = hashlib.sha256(b"".join(np.ascontiguousarray(o.numpy()).tobytes() for o in out)).hexdigest()
print(json.dumps({"ms": best / len(data) * 1e3, "sha": sha, "cls": type(proc).__name__}))
"""


def rows_sha(rows: list[torch.Tensor]) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(r.numpy()).tobytes() for r in rows)).hexdigest()


def hf_fast(python: Path, jpegs: list[bytes], repeat: int) -> dict | None:
    """HF's fast (torchvision) processor timed in `python`'s venv on the same files, or None if it cannot run."""
    if not python.exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        for i, b in enumerate(jpegs):
            (Path(tmp) / f"{i:03d}.jpg").write_bytes(b)
        run = subprocess.run([str(python), "-c", HF_SNIPPET, tmp, str(MAX_PIXELS), str(repeat)], capture_output=True,
                             text=True, timeout=600, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    if run.returncode != 0:
        print(f"HF fast processor not measured: {run.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hf-python", type=Path, default=PEER, help="a python with transformers + torchvision")
    args = ap.parse_args()
    torch.set_num_threads(1)
    jpegs = photographic_jpegs(args.n)
    opts = ImageOptions(min_pixels=3136, max_pixels=MAX_PIXELS, exif_transpose=False)
    items = [process_image(b, opts) for b in jpegs]
    one = items[0]
    print(f"1024x768 JPEG at max_pixels {MAX_PIXELS}: grid {one.imgs_sizes[0].tolist()}, uint8 frames "
          f"{one.nbytes} B, float32 rows {one.pixel_values.nbytes} B ({one.pixel_values.nbytes / one.nbytes:.2f}x)")
    ray_frames = len(pickle.dumps(_media_to_store(one), protocol=5))
    ray_rows = len(pickle.dumps(_to_store(one.pixel_values), protocol=5))
    print(f"Ray media ref payload per item (pickle protocol 5, what ray.put serialises): frames {ray_frames} B, "
          f"rows {ray_rows} B ({ray_rows / ray_frames:.2f}x)")

    n = len(jpegs)
    decode = best_time(lambda: [Image.open(io.BytesIO(b)).convert("RGB") for b in jpegs], args.repeat) / n * 1e3
    frames = best_time(lambda: [process_image(b, opts) for b in jpegs], args.repeat) / n * 1e3
    rows = best_time(lambda: [process_image(b, opts).pixel_values for b in jpegs], args.repeat) / n * 1e3
    print(f"one thread, ms per image: bare decode {decode:.2f}, ours to uint8 frames {frames:.2f} "
          f"({frames / decode:.2f}x decode), ours to float32 rows {rows:.2f} ({rows / decode:.2f}x decode)")
    hf = hf_fast(args.hf_python, jpegs, args.repeat)
    hf_ratio = float("nan")
    if hf is not None:
        same = hf["sha"] == rows_sha([it.pixel_values for it in items])
        hf_ratio = hf["ms"] / frames
        print(f"HF {hf['cls']} (torchvision, {args.hf_python}): {hf['ms']:.2f} ms per image, rows identical to "
              f"ours: {same}; {hf_ratio:.2f}x our time to frames")
    print(f"frames_vs_decode={frames / decode:.2f} rows_vs_decode={rows / decode:.2f} hf_vs_frames={hf_ratio:.2f} "
          f"bytes_ratio={one.pixel_values.nbytes / one.nbytes:.2f}")


if __name__ == "__main__":
    main()
