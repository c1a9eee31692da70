"""A request's media processing options: mm_processor_kwargs and vLLM's media_io_kwargs, checked against the caps."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mm_infer.media.frame_sampling import SAMPLERS, VLLM_MAX_FPS
from mm_infer.prompt.media import (
    IMAGE_KWARGS,
    REQUEST_KWARGS,
    VIDEO_KWARGS,
    MediaDefaults,
    image_overrides,
    video_overrides,
)
from servers.openai.bodies.errors import ApiError
from servers.openai.config import MediaCaps

IMAGE_KEYS = IMAGE_KWARGS & REQUEST_KWARGS  # what a request may send: the library's table, filtered
VIDEO_KEYS = VIDEO_KWARGS & REQUEST_KWARGS
MEDIA_IO_VIDEO_KEYS = frozenset({"fps", "num_frames"})  # vLLM's media_io_kwargs["video"] keys honoured here
_COUNTS = ("num_frames", "total_pixels", "min_pixels", "max_pixels", "video_min_pixels", "video_max_pixels")


@dataclass(frozen=True)
class MediaOptions:
    """Per-request processing options after checking them against the server caps."""

    image: tuple[tuple[str, Any], ...]
    video: tuple[tuple[str, Any], ...]


def media_io_video(kwargs: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """The video part of a vLLM media_io_kwargs ({"video": {"fps": F, "num_frames": N}}): 400 on anything else."""
    if not kwargs:
        return {}
    if not isinstance(kwargs, Mapping) or (other := sorted(set(kwargs) - {"video", "image"})):
        raise ApiError(400, f"{where} takes {{'video': {{...}}}}; unrecognized: {other if other else kwargs!r}",
                       param=where)
    if kwargs.get("image"):
        raise ApiError(400, f"{where}.image is not supported (use mm_processor_kwargs min_pixels / max_pixels)",
                       param=f"{where}.image")
    video = kwargs.get("video") or {}
    if not isinstance(video, Mapping) or (unknown := sorted(set(video) - MEDIA_IO_VIDEO_KEYS)):
        raise ApiError(400, f"unrecognized {where}.video keys: {unknown if isinstance(video, Mapping) else video!r}; "
                       f"supported: {sorted(MEDIA_IO_VIDEO_KEYS)}", param=f"{where}.video")
    return dict(video)


def layered(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Later layers win; a layer that sets fps without num_frames (or the reverse) drops the other from below, as
    vLLM merges media_io_kwargs. One layer setting both is a 400: they are exclusive (HF's sample_frames)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        if "fps" in layer and "num_frames" in layer:
            raise ApiError(400, "fps and num_frames are mutually exclusive: give one", param="num_frames")
        if "fps" in layer:
            merged.pop("num_frames", None)
        if "num_frames" in layer:
            merged.pop("fps", None)
        merged.update(layer)
    return merged


def _check_value(key: str, value: Any, cap: int | float | None) -> None:
    param = f"mm_processor_kwargs.{key}"
    if key == "do_sample_frames":
        if not isinstance(value, bool):
            raise ApiError(400, f"{param} must be true or false", param=param)
        return
    if key == "sampler":
        if value not in SAMPLERS:
            raise ApiError(400, f"{param} must be one of {', '.join(SAMPLERS)}, got {value!r}", param=param)
        return
    if key == "frame_indices":
        if not isinstance(value, list) or not value or not all(
                isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
            raise ApiError(400, f"{param} must be a non-empty list of frame numbers (integers >= 0)", param=param)
        if cap is not None and len(value) > cap:
            raise ApiError(400, f"{param} has {len(value)} frames, above this server's cap of {cap} "
                           "(--max-video-frames)", param=param)
        return
    kind = (int, float) if key == "fps" else int
    if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:
        raise ApiError(400, f"{param} must be a positive {'number' if key == 'fps' else 'integer'}", param=param)
    if cap is not None and value > cap:
        raise ApiError(400, f"{param}={value} is above this server's cap of {cap}", param=param)


def _caps(caps: MediaCaps, defaults: MediaDefaults) -> dict[str, int | float | None]:
    image_max = caps.image_max_pixels or defaults.image_max_pixels
    video_max = caps.video_max_pixels or defaults.video_max_pixels
    return {"max_pixels": image_max, "min_pixels": image_max, "video_max_pixels": video_max,
            "video_min_pixels": video_max, "total_pixels": None, "num_frames": caps.max_video_frames,
            "frame_indices": caps.max_video_frames, "fps": caps.max_video_fps or VLLM_MAX_FPS}


def media_options(mm_processor_kwargs: Mapping[str, Any] | None, media_io_kwargs: Mapping[str, Any] | None,
                  caps: MediaCaps, defaults: MediaDefaults) -> MediaOptions:
    """Server video defaults (--media-io-kwargs), then the request's media_io_kwargs, then its mm_processor_kwargs:
    known keys only, never above the caps (400 naming the key otherwise)."""
    kw = dict(mm_processor_kwargs or {})
    if unknown := sorted(set(kw) - IMAGE_KEYS - VIDEO_KEYS):
        raise ApiError(400, f"unrecognized mm_processor_kwargs: {', '.join(unknown)}", param="mm_processor_kwargs")
    video_kw = layered(dict(caps.video_defaults), media_io_video(media_io_kwargs, "media_io_kwargs"),
                       {k: v for k, v in kw.items() if k in VIDEO_KEYS})
    limits = _caps(caps, defaults)
    for key, value in [*((k, v) for k, v in kw.items() if k in IMAGE_KEYS), *video_kw.items()]:
        _check_value(key, value, limits[key] if key in limits else None)
    given = {**{k: v for k, v in kw.items() if k in IMAGE_KEYS}, **video_kw}
    given.setdefault("max_pixels", limits["max_pixels"])  # the server's caps stand in for the checkpoint's bounds
    given.setdefault("video_max_pixels", limits["video_max_pixels"])
    image, video = image_overrides(given, defaults), video_overrides(given, defaults)
    for name, opts in (("image", image), ("video", video)):
        if opts["min_pixels"] and opts["max_pixels"] and opts["min_pixels"] > opts["max_pixels"]:
            raise ApiError(400, f"{name} min_pixels ({opts['min_pixels']}) is above max_pixels "
                           f"({opts['max_pixels']})", param="mm_processor_kwargs")
    return MediaOptions(tuple(sorted(image.items())), tuple(sorted(video.items())))
