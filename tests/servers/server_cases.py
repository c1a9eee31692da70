"""Shared constants and helpers for the server tests (paths, limits, data URLs)."""

from __future__ import annotations

import base64
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "assets" / "models" / "tiny-qwen2-vl"
MEDIA = REPO / "assets" / "media"
API_KEY = "test-key"
MAX_MODEL_LEN = 1024
NUM_BLOCKS = 256
SMALL = 12544  # max_pixels for test images: at most 16 patches


def data_url(path: Path, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"
