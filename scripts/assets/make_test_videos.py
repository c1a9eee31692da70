"""Write the extra parity videos in assets/media/videos: camera pans over photo.png in more codecs and frame rates.

Usage: python scripts/assets/make_test_videos.py   (rewrites the files and their sha256 in assets/media/MANIFEST.json)
They cover what the four shared videos do not: 30 and 29.97 fps sources, VP8, a 2 fps clip of 59 frames (HF's
float32 index step overshoots its last frame there) and a long clip whose temporal grid exceeds h/merge (M-RoPE).
"""

from __future__ import annotations

import hashlib
import json
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
MEDIA = REPO / "assets" / "media"

# name: (codec, container format, frame rate, frames, (width, height))
EXTRA_VIDEOS: dict[str, tuple[str, str, Fraction, int, tuple[int, int]]] = {
    "pan_h264_30fps.mp4": ("libx264", "mp4", Fraction(30), 100, (160, 120)),
    "pan_mpeg4_2997fps.mp4": ("mpeg4", "mp4", Fraction(30000, 1001), 90, (176, 144)),
    "pan_vp8_12fps.webm": ("libvpx", "webm", Fraction(12), 50, (128, 96)),
    "pan_h264_2fps_59.mp4": ("libx264", "mp4", Fraction(2), 59, (112, 84)),
    "long_h264_2fps_80.mp4": ("libx264", "mp4", Fraction(2), 80, (56, 56)),
}


def pan_frames(n: int, size: tuple[int, int]) -> list[np.ndarray]:
    """n uint8 [h, w, 3] windows sliding left to right and down over photo.png."""
    width, height = size
    photo = np.asarray(Image.open(MEDIA / "images" / "photo.png").convert("RGB"))
    span_y, span_x = photo.shape[0] - height, photo.shape[1] - width
    return [np.ascontiguousarray(photo[i * span_y // max(n - 1, 1) // 4:][:height,
                                       i * span_x // max(n - 1, 1):][:, :width]) for i in range(n)]


def encode(codec: str, fmt: str, rate: Fraction, frames: list[np.ndarray]) -> bytes:
    import io

    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        if codec == "libx264":
            stream.options = {"preset": "medium", "crf": "23", "threads": "1"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, "rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def main() -> None:
    manifest_path = MEDIA / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    for name, (codec, fmt, rate, n, size) in EXTRA_VIDEOS.items():
        data = encode(codec, fmt, rate, pan_frames(n, size))
        (MEDIA / "videos" / name).write_bytes(data)
        manifest[f"videos/{name}"] = hashlib.sha256(data).hexdigest()
        print(f"{name}: {len(data)} bytes")
    manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")


if __name__ == "__main__":
    main()
