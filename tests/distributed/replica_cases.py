"""Shared pieces of the replica tests: the checkpoint, engine options, distinct images and prompt builders."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parents[2]
CKPT = ROOT / "assets" / "models" / "tiny-qwen2-vl"
OPTIONS: dict[str, Any] = {"num_kv_blocks": 512, "max_model_len": 1024, "cpu_threads": 1, "batch_invariant": True}
COLOURS = ["red", "green", "blue", "yellow", "purple", "orange"]


def png(colour: str, size: int = 56) -> bytes:
    """A small distinct PNG: a coloured disc on white (its content hash differs per colour)."""
    image = Image.new("RGB", (size, size), "white")
    ImageDraw.Draw(image).ellipse((8, 8, size - 8, size - 8), fill=colour)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def image_prompt(image: bytes, text: str = "What colour is the shape?") -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}],
            "multi_modal_data": {"image": [image]}}


def text_prompt(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}
