"""MediaResolver: media references -> PackedTensors, fetched and decoded concurrently off the event loop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from mm_infer.media import MediaProcessor, MediaTooLargeError, PackedTensor
from mm_infer.media.cache import ByteLRU
from mm_infer.prompt.media import MediaDefaults
from servers.openai.config import MediaCaps
from servers.openai.errors import ApiError
from servers.openai.fetch import MediaFetcher
from servers.openai.messages import MediaRef

IMAGE_KEYS = {"min_pixels", "max_pixels"}
VIDEO_KEYS = {"fps", "num_frames", "video_min_pixels", "video_max_pixels", "total_pixels"}
Processed = tuple[PackedTensor, float | None]  # (one item, second_per_grid_t for videos)


@dataclass(frozen=True)
class MediaOptions:
    """Per-request processing options after checking them against the server caps."""

    image: tuple[tuple[str, Any], ...]
    video: tuple[tuple[str, Any], ...]


class MediaResolver:
    """Fetch, decode and cache (by uuid) a request's media under the server's caps."""

    def __init__(self, fetcher: MediaFetcher, processor: MediaProcessor, defaults: MediaDefaults,
                 caps: MediaCaps) -> None:
        self.fetcher = fetcher
        self.processor = processor
        self.caps = caps
        self.image_max = caps.image_max_pixels or defaults.image_max_pixels
        self.video_max = caps.video_max_pixels or defaults.video_max_pixels
        self.max_fps = caps.max_video_fps or defaults.video_fps
        self.defaults = defaults
        self._by_uuid: ByteLRU[Processed] = ByteLRU(caps.uuid_cache_bytes)

    @property
    def uuid_hits(self) -> int:
        return self._by_uuid.hits

    def options(self, kwargs: dict[str, Any] | None) -> MediaOptions:
        """Check mm_processor_kwargs: known keys only, and never above the server caps (400 otherwise)."""
        kw = dict(kwargs or {})
        if unknown := sorted(set(kw) - IMAGE_KEYS - VIDEO_KEYS):
            raise ApiError(400, f"unrecognized mm_processor_kwargs: {', '.join(unknown)}",
                           param="mm_processor_kwargs")
        limits = {"max_pixels": self.image_max, "min_pixels": self.image_max, "video_max_pixels": self.video_max,
                  "video_min_pixels": self.video_max, "total_pixels": None,
                  "num_frames": self.caps.max_video_frames, "fps": self.max_fps}
        for key, value in kw.items():
            kind = (int, float) if key == "fps" else int
            if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:
                raise ApiError(400, f"mm_processor_kwargs.{key} must be a positive "
                               f"{'number' if key == 'fps' else 'integer'}", param=f"mm_processor_kwargs.{key}")
            cap = limits[key]
            if cap is not None and value > cap:
                raise ApiError(400, f"mm_processor_kwargs.{key}={value} is above this server's cap of {cap}",
                               param=f"mm_processor_kwargs.{key}")
        image = {"min_pixels": kw.get("min_pixels", self.defaults.image_min_pixels),
                 "max_pixels": kw.get("max_pixels", self.image_max)}
        video = {"min_pixels": kw.get("video_min_pixels", self.defaults.video_min_pixels),
                 "max_pixels": kw.get("video_max_pixels", self.video_max), "fps": float(kw.get("fps", self.max_fps)),
                 "num_frames": kw.get("num_frames"), "total_pixels": kw.get("total_pixels")}
        for name, opts in (("image", image), ("video", video)):
            if opts["min_pixels"] and opts["max_pixels"] and opts["min_pixels"] > opts["max_pixels"]:
                raise ApiError(400, f"{name} min_pixels ({opts['min_pixels']}) is above max_pixels "
                               f"({opts['max_pixels']})", param="mm_processor_kwargs")
        return MediaOptions(tuple(sorted(image.items())), tuple(sorted(video.items())))

    async def _one(self, ref: MediaRef, opts: MediaOptions) -> Processed:
        key = f"{ref.kind}|{ref.uuid}|{opts!r}"
        if ref.uuid and (hit := self._by_uuid.get(key)) is not None:
            return hit
        if ref.url is None:
            raise ApiError(400, f"no cached {ref.kind} for uuid {ref.uuid!r}; send its URL again", param="uuid")
        data = await self.fetcher.fetch(ref.url)
        overrides = dict(opts.image if ref.kind == "image" else opts.video)
        packed, metas = await self.processor.aprocess(ref.kind, [data], **overrides)
        meta = metas[0]
        result = (packed, meta.second_per_grid_ts if meta is not None else None)
        if ref.uuid:
            self._by_uuid.put(key, result, packed.pixel_values.nbytes)
        return result

    async def resolve(self, refs: list[MediaRef], opts: MediaOptions) -> tuple[dict[str, Any], dict[str, Any]]:
        """(multi_modal_data, engine mm_processor_kwargs) for the prompt's media, in prompt order per kind."""
        if len(refs) > self.processor.limits.max_items:
            raise MediaTooLargeError(f"{len(refs)} media items, over the limit of {self.processor.limits.max_items}")
        done = await asyncio.gather(*(self._one(r, opts) for r in refs))
        data: dict[str, Any] = {}
        kwargs: dict[str, Any] = {}
        for kind in ("image", "video"):
            parts = [p for r, p in zip(refs, done, strict=True) if r.kind == kind]
            if parts:
                data[kind] = PackedTensor.concat([p for p, _ in parts])
        seconds = [s for r, (_, s) in zip(refs, done, strict=True) if r.kind == "video"]
        if seconds:
            kwargs["second_per_grid_ts"] = [float(s or 0.0) for s in seconds]
        return data, kwargs
