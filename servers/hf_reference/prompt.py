"""OpenAI chat messages -> expanded prompt ids and media, with the checkpoint's template and mm_infer.media pixels
(Qwen2-VL family, or Nemotron Omni's <image> / <video> markers expanded as HF's processor does)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mm_infer.config import MediaConfig
from mm_infer.media import PackedTensor, preprocess_images, preprocess_videos
from mm_infer.models.config import load_config
from mm_infer.prompt import replace_prefix_tokens
from mm_infer.prompt.inputs import PromptInput
from mm_infer.prompt.media import image_items, media_defaults, video_items
from mm_infer.prompt.omni_placeholders import OmniTokens
from mm_infer.prompt.placeholders import PlaceholderIds
from mm_infer.prompt.preparer import build_omni_request, build_request
from mm_infer.prompt.request import VLMRequest, items_from_packed
from mm_infer.prompt.templating import flat_token_ids

PARTS = {"image_url": "image", "input_image": "image", "video_url": "video", "input_video": "video"}


class BadRequest(ValueError):
    """The request cannot be answered (a 400)."""


@dataclass
class Prompt:
    """Expanded prompt ids (as the engine builds them) plus the media in HF's keyword layout."""

    token_ids: list[int]
    images: PackedTensor | None
    videos: PackedTensor | None
    second_per_grid_ts: list[float] | None
    request: VLMRequest | None = None  # Nemotron Omni: the prepared request (its items carry the pixel rows)


def _url(part: dict[str, Any]) -> str:
    ref = part.get(part["type"] if part["type"] in ("image_url", "video_url") else
                   ("image_url" if part["type"] == "input_image" else "video_url"))
    url = ref.get("url") if isinstance(ref, dict) else ref
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        raise BadRequest(f"{part['type']}: only base64 data: URLs are supported by the HF reference")
    return url


def data_bytes(url: str) -> bytes:
    return base64.b64decode(url.split(";base64,", 1)[1])


def _content(content: Any, media: list[tuple[str, bytes]]) -> str | list[dict[str, Any]]:
    if content is None or isinstance(content, str):
        return content or ""
    out: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type")
        if kind in ("text", "input_text"):
            out.append({"type": "text", "text": part["text"]})
        elif kind in PARTS:
            media.append((PARTS[kind], data_bytes(_url(part))))
            out.append({"type": PARTS[kind]})
        else:
            raise BadRequest(f"unsupported content part type {kind!r}")
    return out


class PromptBuilder:
    """Template with the HF tokenizer, splice carried turn ids, expand media pads like mm_infer's engine."""

    def __init__(self, model_dir: str | Path, tokenizer: Any, config: Any) -> None:
        self.tokenizer = tokenizer
        self.defaults = media_defaults(model_dir, MediaConfig())
        ours = load_config(model_dir)
        self.omni = (OmniTokens(ours.image_token_id, ours.video_token_id, ours.vision_start_token_id,
                                ours.vision_end_token_id) if ours.kind == "nemotron_h_omni" else None)
        self.temporal_patch = ours.vision.temporal_patch_size
        if self.omni is not None:
            self.merge = ours.vision.spatial_merge_size
            return
        self.ids = PlaceholderIds(config.image_token_id, config.video_token_id, config.vision_start_token_id,
                                  config.vision_end_token_id)
        self.merge = int(config.vision_config.spatial_merge_size)
        self.tokens_per_second = (float(config.vision_config.tokens_per_second)
                                  if config.model_type == "qwen2_5_vl" else None)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return flat_token_ids(self.tokenizer.encode(text, add_special_tokens=False))

    def _pixels(self, media: list[tuple[str, bytes]]
                ) -> tuple[PackedTensor | None, PackedTensor | None, list[float], list[list[float]] | None]:
        """Images, videos, seconds per temporal patch and (Qwen3-VL) each video's frame timestamps, with the
        checkpoint's patch spec and video processor, as the engine's preparer does."""
        d = self.defaults
        images = [b for k, b in media if k == "image"]
        videos = [b for k, b in media if k == "video"]
        packed_images = (preprocess_images(images, min_pixels=d.image_min_pixels, max_pixels=d.image_max_pixels,
                                           spec=d.spec) if images else None)
        packed_videos, seconds, stamps = None, [], None
        if videos:
            packed_videos, metas = preprocess_videos(videos, fps=d.video_fps, min_pixels=d.video_min_pixels,
                                                     max_pixels=d.video_max_pixels, spec=d.spec,
                                                     sampler=d.video_sampler, family=d.video_family,
                                                     min_frames=d.video_min_frames, max_frames=d.video_max_frames)
            seconds = [float(m.second_per_grid_ts) for m in metas]
            stamps = d.timestamps(metas)
        return packed_images, packed_videos, seconds, stamps

    def build(self, messages: list[dict[str, Any]]) -> Prompt:
        media: list[tuple[str, bytes]] = []
        chat: list[dict[str, Any]] = []
        carried: tuple[int, list[int]] | None = None
        for i, msg in enumerate(messages):
            d: dict[str, Any] = {"role": msg["role"], "content": _content(msg.get("content"), media)}
            if msg.get("tool_calls"):
                d["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(
                    c["function"]["arguments"])}} for c in msg["tool_calls"]]
            if msg.get("prompt_token_ids") is not None and msg.get("generation_token_ids") is not None:
                carried = (i, [*msg["prompt_token_ids"], *msg["generation_token_ids"]])
            chat.append(d)
        ids = self.render(chat, add_generation_prompt=True)
        if carried is not None:
            prefix = self.render(chat[:carried[0] + 1], add_generation_prompt=False)
            ids = replace_prefix_tokens(self.tokenizer, carried[1], prefix, ids)
        if self.omni is not None:
            return self._omni(ids, media)
        images, videos, seconds, stamps = self._pixels(media)
        typed = PromptInput(token_ids=ids, images=items_from_packed("image", images) if images else [],
                            videos=items_from_packed("video", videos, seconds, stamps) if videos else [])
        req = build_request(self.tokenizer, self.ids, typed, merge_size=self.merge,
                            tokens_per_second=self.tokens_per_second)
        return Prompt(req.prompt_token_ids, images, videos, seconds or None)

    def _omni(self, ids: list[int], media: list[tuple[str, bytes]]) -> Prompt:
        """Nemotron Omni: items by the preparer's own media path, markers expanded (or expanded runs checked)."""
        images = [b for k, b in media if k == "image"]
        videos = [b for k, b in media if k == "video"]
        typed = PromptInput(token_ids=ids, images=image_items(images, {}, self.defaults) if images else [],
                            videos=video_items(videos, {}, self.defaults) if videos else [])
        req = build_omni_request(self.tokenizer, self.omni, typed, merge_size=self.merge,  # type: ignore[arg-type]
                                 temporal_patch=self.temporal_patch)
        return Prompt(req.prompt_token_ids, None, None, None, req)
