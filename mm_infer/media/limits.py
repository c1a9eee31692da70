"""Limits that keep hostile or oversized media from exhausting memory or time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MediaLimits:
    """Caps checked before and during decoding; exceeding any gives a 413 MediaTooLargeError."""

    max_bytes: int = 64 * 1024 * 1024  # encoded size of one item
    max_image_pixels: int = 64 * 1024 * 1024  # width*height from the header, before decode
    max_video_frames: int = 100_000  # frames in the container
    max_video_seconds: float = 3600.0
    max_sampled_frames: int = 768  # frames the sampler may pick
    max_items: int = 256  # media items in one call


DEFAULT_LIMITS = MediaLimits()
