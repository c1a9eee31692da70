"""Where the test media and golden outputs live: the in-repo copy, and ../shared when present."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / "assets" / "media"
IMAGES = ASSETS / "images"
VIDEOS = ASSETS / "videos"
GOLDEN_INDEX = json.loads((REPO / "assets" / "golden" / "qwen2vl" / "INDEX.json").read_text())
SHARED_GOLDEN = REPO.parent / "shared" / "golden" / "qwen2vl"
GOLDEN_IMAGE_KW = {"min_pixels": 3136, "max_pixels": 200704}
GOLDEN_VIDEO_KW = {"min_pixels": 3136, "max_pixels": 100352, "sampler": "qwen"}  # their README: qwen-vl-utils frames
