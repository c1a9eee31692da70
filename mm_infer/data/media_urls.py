"""Samples' media as data URLs for the OpenAI chat API: PNG images, and videos as lossless PNG-in-QuickTime."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

VIDEO_FPS = 2  # at 2 fps both HF's and qwen-vl-utils' frame rules take every frame of a short even-length clip


def png_bytes(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def video_bytes(frames: np.ndarray, fps: int = VIDEO_FPS) -> bytes:
    """uint8 [T, H, W, 3] -> a QuickTime file of PNG frames: decodes back to exactly the same RGB frames."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mov") as container:
        stream = container.add_stream("png", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "rgb24"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")))
        container.mux(stream.encode(None))
    return buf.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def image_url(image: np.ndarray) -> str:
    return data_url(png_bytes(image), "image/png")


def video_url(frames: np.ndarray) -> str:
    return data_url(video_bytes(frames), "video/quicktime")
