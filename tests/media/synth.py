"""Real encoded media made on the fly for tests: JPEGs, videos, broken and hostile files."""

from __future__ import annotations

import io
import struct
import zlib

import av
import numpy as np
from PIL import Image


def jpeg_bytes(width: int = 64, height: int = 48, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def png_with_claimed_size(width: int, height: int) -> bytes:
    """A real PNG whose IHDR claims width x height (CRC fixed): a decompression bomb's header."""
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, "PNG")
    data = bytearray(buf.getvalue())
    ihdr = 8 + 8  # signature, then chunk length + type
    data[ihdr : ihdr + 8] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[12 : ihdr + 13]))
    data[ihdr + 13 : ihdr + 17] = struct.pack(">I", crc)
    return bytes(data)


def video_bytes(n_frames: int, fps: int = 10, size: tuple[int, int] = (64, 48), codec: str = "libx264",
                fmt: str = "mp4") -> bytes:
    """An encoded video of moving noise; n_frames may be 0 (a stream with no frames)."""
    width, height = size
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        out.start_encoding()  # writes the header even when no frame follows
        rng = np.random.default_rng(1)
        base = rng.integers(0, 255, (height, width * 2, 3), dtype=np.uint8)
        for i in range(n_frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(base[:, i % width : i % width + width]), "rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def wav_bytes(seconds: float = 0.2, rate: int = 8000) -> bytes:
    """An audio-only container (no video stream)."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="wav") as out:
        stream = out.add_stream("pcm_s16le", rate=rate)
        samples = np.zeros((1, int(seconds * rate)), dtype=np.int16)
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = rate
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()
