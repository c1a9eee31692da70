"""Rollout rows shared by the hybrid models' RL tests: an image, two images, a video, each with a one-letter truth."""

from __future__ import annotations

from pathlib import Path

from mm_infer.rl import RolloutRow

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "assets" / "media" / "images"
VIDEOS = REPO / "assets" / "media" / "videos"


def prompt(media: dict[str, list[Path]], question: str, processor_kwargs: dict | None = None) -> dict:
    """One user turn with these media files (in order), then the question; the files as multi_modal_data."""
    parts = [{"type": kind} for kind, items in media.items() for _ in items]
    out = {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}],
           "multi_modal_data": {k: [str(p) for p in v] for k, v in media.items()}}
    return out | ({"mm_processor_kwargs": processor_kwargs} if processor_kwargs else {})


def rows(processor_kwargs: dict | None = None) -> list[RolloutRow]:
    return [
        RolloutRow(prompt({"image": [IMAGES / "photo_q90.jpg"]}, "What colour is it?", processor_kwargs), "e"),
        RolloutRow(prompt({"image": [IMAGES / "tiny_9x13.png", IMAGES / "rgba.png"]}, "Compare them.",
                          processor_kwargs), "a"),
        RolloutRow(prompt({"video": [VIDEOS / "odd7_h264_2fps.mp4"]}, "What moves?", processor_kwargs), "o"),
    ]


def reward(text: str, truth: str) -> float:
    return float(text.count(truth))
