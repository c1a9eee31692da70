"""The parity suite: fixed, seeded multimodal chat conversations (image, video, multi-turn, encoded videos in several
codecs and frame rates) as OpenAI parts."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mm_infer.data import make_sample
from mm_infer.data.media_urls import image_url, video_url

SUITES = ("image", "video", "multiturn", "codecs")
DEFAULT_SUITES = ("image", "video", "multiturn")
# the encoded parity videos (assets/media/videos in a checkout): H.264, MPEG-4, VP8, VP9 at 2 to 30 fps
CODEC_VIDEOS = Path(__file__).resolve().parents[2] / "assets" / "media" / "videos"
VIDEO_MIME = {".mp4": "video/mp4", ".webm": "video/webm", ".avi": "video/x-msvideo", ".mov": "video/quicktime"}


@dataclass(frozen=True)
class Case:
    """One conversation: user turns (content parts), each answered with its own max_tokens."""

    name: str
    suite: str
    turns: list[list[dict[str, Any]]]
    max_tokens: list[int]


def _image(seed: int, index: int, task: str) -> tuple[dict[str, Any], str]:
    s = make_sample(seed, index, task)
    return {"type": "image_url", "image_url": {"url": image_url(s.media)}}, s.question


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def build_suite(suites: list[str], seed: int = 0) -> list[Case]:
    """The fixed suite for a seed: same media, questions and max_tokens on every run."""
    cases: list[Case] = []
    if "image" in suites:
        for i, (task, n) in enumerate((("colour", 8), ("shape", 16), ("count", 4))):
            part, q = _image(seed, i, task)
            cases.append(Case(f"image-{task}", "image", [[part, _text(q)]], [n]))
        (p1, _), (p2, _) = _image(seed, 3, "count"), _image(seed, 4, "shape")
        cases.append(Case("image-pair", "image", [[p1, p2, _text("Which image has more shapes?")]], [12]))
    if "video" in suites:
        v = make_sample(seed, 5, "direction")
        part = {"type": "video_url", "video_url": {"url": video_url(v.media)}}
        cases.append(Case("video-direction", "video", [[part, _text(v.question)]], [8]))
        img, _ = _image(seed, 6, "colour")
        cases.append(Case("video-and-image", "video", [[img, part, _text("Describe both.")]], [12]))
    if "multiturn" in suites:
        part, q = _image(seed, 7, "colour")
        cases.append(Case("multiturn-image", "multiturn", [[part, _text(q)], [_text("What shape is it?")]], [6, 8]))
    if "codecs" in suites:
        cases += codec_cases(CODEC_VIDEOS)
    return cases


def codec_cases(folder: Path) -> list[Case]:
    """One greedy case per encoded video in `folder` (sent as a data URL), sorted by name."""
    cases = []
    for path in sorted(p for p in folder.glob("*") if p.suffix in VIDEO_MIME):
        url = f"data:{VIDEO_MIME[path.suffix]};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"
        part = {"type": "video_url", "video_url": {"url": url}}
        cases.append(Case(f"codec-{path.name}", "codecs", [[part, _text("What happens in this video?")]], [8]))
    return cases
