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
    # Frames decoded (sequentially, up to the last sampled one) x width x height of one video, checked from
    # the header before decoding and again frame by frame. It bounds decode time; memory is bounded by the
    # sampled frames at their target size. 2**35 (34.4 G) admits the longest video the default sampler
    # fully uses (768 frames at 2 fps = 6.4 min) at 1080p30 (23.9 G) with room to spare: 9.2 min of 1080p30,
    # 2.3 min of 4K30, an hour of 360p25; 64 frames of 4096x4096 need 1.1 G.
    max_video_decode_pixels: int = 2**35
    max_items: int = 256  # media items in one call


DEFAULT_LIMITS = MediaLimits()
