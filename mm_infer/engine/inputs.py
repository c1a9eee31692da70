"""Prompt dicts (vLLM shape) to VLMRequest: media preprocessing with the checkpoint's defaults."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mm_infer.config import MediaConfig
from mm_infer.engine.request import VLMRequest, build_vlm_request
from mm_infer.media.packed import PackedTensor
from mm_infer.prompt.placeholders import PlaceholderIds, PromptError

PROMPT_KEYS = {"prompt", "prompt_token_ids", "messages", "multi_modal_data", "mm_processor_kwargs",
               "media_tokens_preexpanded", "chat_template_kwargs"}
IMAGE_KWARGS = {"min_pixels", "max_pixels", "backend", "exif_transpose"}
VIDEO_KWARGS = {"fps", "num_frames", "frame_indices", "total_pixels", "sampler", "decoder", "video_min_pixels",
                "video_max_pixels", "second_per_grid_ts"}


@dataclass(frozen=True)
class MediaDefaults:
    image_min_pixels: int | None
    image_max_pixels: int | None
    video_min_pixels: int | None
    video_max_pixels: int | None
    video_fps: float
    temporal_patch_size: int = 2


def _pixels(cfg: Mapping[str, Any]) -> tuple[int | None, int | None]:
    size = cfg.get("size") or {}
    return (cfg.get("min_pixels", size.get("shortest_edge")), cfg.get("max_pixels", size.get("longest_edge")))


def media_defaults(model_dir: str | Path, media: MediaConfig) -> MediaDefaults:
    """Engine options first, then preprocessor_config.json / video_preprocessor_config.json."""
    def read(name: str) -> dict[str, Any]:
        path = Path(model_dir) / name
        return json.loads(path.read_text()) if path.exists() else {}

    image, video = read("preprocessor_config.json"), read("video_preprocessor_config.json") or {}
    (imin, imax), (vmin, vmax) = _pixels(image), _pixels(video or image)
    return MediaDefaults(
        media.image_min_pixels or imin, media.image_max_pixels or imax, media.video_min_pixels or vmin,
        media.video_max_pixels or vmax, float(video.get("fps", media.video_fps)),
        int(image.get("temporal_patch_size", 2)))


def _as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _images(items: Any, kw: Mapping[str, Any], d: MediaDefaults) -> PackedTensor:
    if isinstance(items, PackedTensor):
        return items
    from mm_infer.media import preprocess_images

    opts = {k: kw[k] for k in IMAGE_KWARGS if k in kw}
    opts.setdefault("min_pixels", d.image_min_pixels)
    opts.setdefault("max_pixels", d.image_max_pixels)
    return preprocess_images(_as_list(items), **opts)


def _videos(items: Any, kw: Mapping[str, Any], d: MediaDefaults) -> tuple[PackedTensor, list[float]]:
    fps = float(kw.get("fps", d.video_fps))
    if isinstance(items, PackedTensor):
        seconds = kw.get("second_per_grid_ts", [d.temporal_patch_size / fps] * len(items))
        return items, [float(s) for s in _as_list(seconds)]
    from mm_infer.media import preprocess_videos

    opts = {k: kw[k] for k in ("num_frames", "frame_indices", "total_pixels", "sampler", "decoder") if k in kw}
    packed, meta = preprocess_videos(_as_list(items) if isinstance(items, (list, tuple)) else [items], fps=fps,
                                     min_pixels=kw.get("video_min_pixels", d.video_min_pixels),
                                     max_pixels=kw.get("video_max_pixels", d.video_max_pixels), **opts)
    return packed, [m.second_per_grid_ts for m in meta]


def prepare_request(prompt: str | Mapping[str, Any], tokenizer: Any, ids: PlaceholderIds, defaults: MediaDefaults,
                    *, merge_size: int, tokens_per_second: float | None) -> VLMRequest:
    """A prompt (text, or dict with prompt / prompt_token_ids / messages and media) -> VLMRequest."""
    if isinstance(prompt, str):
        prompt = {"prompt": prompt}
    if not isinstance(prompt, Mapping):
        raise PromptError(f"a prompt is a str or a dict, got {type(prompt).__name__}")
    if unknown := set(prompt) - PROMPT_KEYS:
        raise PromptError(f"unknown prompt keys {sorted(unknown)}; expected some of {sorted(PROMPT_KEYS)}")
    mm = dict(prompt.get("multi_modal_data") or {})
    if unknown := set(mm) - {"image", "video"}:
        raise PromptError(f"unknown multi_modal_data keys {sorted(unknown)}; expected image and/or video")
    kw = dict(prompt.get("mm_processor_kwargs") or {})
    if unknown := set(kw) - IMAGE_KWARGS - VIDEO_KWARGS:
        raise PromptError(f"unknown mm_processor_kwargs {sorted(unknown)}")
    images = _images(mm["image"], kw, defaults) if mm.get("image") is not None else None
    videos, seconds = _videos(mm["video"], kw, defaults) if mm.get("video") is not None else (None, None)
    return build_vlm_request(
        tokenizer, ids, prompt=prompt.get("prompt"), prompt_token_ids=prompt.get("prompt_token_ids"),
        messages=prompt.get("messages"), images=images, videos=videos, second_per_grid_ts=seconds,
        media_tokens_preexpanded=bool(prompt.get("media_tokens_preexpanded", False)), merge_size=merge_size,
        tokens_per_second=tokens_per_second, chat_template_kwargs=prompt.get("chat_template_kwargs"))
