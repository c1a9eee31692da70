"""MediaProcessor: many media items processed in parallel off the caller's thread, with an LRU cache."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from mm_infer.media.cache import ByteLRU
from mm_infer.media.item_processing import (
    ImageOptions,
    VideoMetadata,
    VideoOptions,
    check_item_count,
    process_image,
    process_video,
)
from mm_infer.media.limits import DEFAULT_LIMITS, MediaLimits
from mm_infer.media.packed import PackedTensor
from mm_infer.media.sources import MediaInput, is_encoded, options_digest, read_encoded

# Threads, not processes: PIL decode/resize, PyAV, decord and torch all release the GIL, and a thread
# hands back the pixel rows without pickling them. scripts/bench/media.py measures both.


class MediaProcessor:
    """Process images and videos on a thread pool; identical (bytes, options) are processed once."""

    def __init__(self, *, max_workers: int | None = None, cache_bytes: int = 512 * 1024 * 1024,
                 limits: MediaLimits = DEFAULT_LIMITS, image_options: ImageOptions = ImageOptions(),
                 video_options: VideoOptions = VideoOptions()) -> None:
        self.limits = limits
        self.image_options = image_options
        self.video_options = video_options
        self._pool = ThreadPoolExecutor(max_workers=max_workers or min(8, os.cpu_count() or 1),
                                        thread_name_prefix="mm-media")
        self.cache: ByteLRU[tuple[PackedTensor, VideoMetadata | None]] = ByteLRU(cache_bytes)

    def _run(self, kind: str, item: MediaInput,
             opts: ImageOptions | VideoOptions) -> tuple[PackedTensor, VideoMetadata | None]:
        key = None
        if is_encoded(item):  # decoded inputs (PIL, arrays) are hashed while processing instead
            item = read_encoded(item, limits=self.limits)
            key = options_digest(item.digest, (kind, opts))
            if (hit := self.cache.get(key)) is not None:
                return hit
        if kind == "image":
            result: tuple[PackedTensor, VideoMetadata | None] = (process_image(item, opts, self.limits), None)
        else:
            result = process_video(item, opts, self.limits)
        if key is not None:
            self.cache.put(key, result, result[0].nbytes)
        return result

    def submit(self, kind: str, item: MediaInput, **overrides: object) -> Future:
        """Schedule one item; `overrides` replace fields of the processor's default options."""
        base = self.image_options if kind == "image" else self.video_options
        opts = replace(base, **{k: v for k, v in overrides.items() if v is not None})
        return self._pool.submit(self._run, kind, item, opts)

    def process(self, kind: str, items: Sequence[MediaInput],
                **overrides: object) -> tuple[PackedTensor, list[VideoMetadata | None]]:
        """Items of one kind -> (PackedTensor in input order, metadata per item: None for images)."""
        check_item_count(len(items), self.limits)
        futures = [self.submit(kind, it, **overrides) for it in items]
        results = [f.result() for f in futures]
        return PackedTensor.concat([p for p, _ in results]), [m for _, m in results]

    def process_images(self, images: Sequence[MediaInput], **overrides: object) -> PackedTensor:
        return self.process("image", images, **overrides)[0]

    def process_videos(self, videos: Sequence[MediaInput],
                       **overrides: object) -> tuple[PackedTensor, list[VideoMetadata]]:
        packed, metas = self.process("video", videos, **overrides)
        return packed, [m for m in metas if m is not None]

    async def aprocess(self, kind: str, items: Sequence[MediaInput],
                       **overrides: object) -> tuple[PackedTensor, list[VideoMetadata | None]]:
        """The same as `process`, awaited without blocking the event loop."""
        check_item_count(len(items), self.limits)
        futures = [asyncio.wrap_future(self.submit(kind, it, **overrides)) for it in items]
        results = await asyncio.gather(*futures)
        return PackedTensor.concat([p for p, _ in results]), [m for _, m in results]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> MediaProcessor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
