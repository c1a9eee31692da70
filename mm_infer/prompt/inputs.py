"""PromptInput: one prompt, typed (text, ids or messages, plus processed media items per kind, in order)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mm_infer.prompt.audio import audio_items
from mm_infer.prompt.media import IMAGE_KWARGS, VIDEO_KWARGS, MediaDefaults, image_items, video_items
from mm_infer.prompt.placeholders import PromptError
from mm_infer.prompt.request import MediaItem

# the keys of a prompt dict (vLLM's shape) that the library accepts
PROMPT_KEYS = frozenset({"prompt", "prompt_token_ids", "messages", "multi_modal_data", "mm_processor_kwargs",
                         "media_tokens_preexpanded", "chat_template_kwargs", "cache_salt"})


@dataclass(frozen=True)
class PromptInput:
    """Exactly one of `text`, `token_ids` or `messages`; each kind's media items in the order of their runs."""

    text: str | None = None
    token_ids: Sequence[int] | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    images: Sequence[MediaItem] = field(default_factory=list)
    videos: Sequence[MediaItem] = field(default_factory=list)
    media_tokens_preexpanded: bool = False
    chat_template_kwargs: Mapping[str, Any] | None = None  # may set add_generation_prompt (default True)
    cache_salt: str | None = None  # prefix-cache hits only among requests with the same salt (vLLM's)
    audios: Sequence[MediaItem] = field(default_factory=list)  # Nemotron Omni with an audio tower only

    def __post_init__(self) -> None:
        given = [name for name in ("text", "token_ids", "messages") if getattr(self, name) is not None]
        if len(given) != 1:
            named = {"text": "prompt", "token_ids": "prompt_token_ids", "messages": "messages"}
            raise PromptError(f"give exactly one of prompt, prompt_token_ids or messages "
                              f"(got {[named[g] for g in given] or 'none'})")


def media_fields(items: Sequence[MediaItem]) -> dict[str, list[MediaItem]]:
    """Items of mixed kinds as PromptInput's `images`, `videos` and `audios`, each kind in its given order."""
    return {f"{m}s": [it for it in items if it.modality == m] for m in ("image", "video", "audio")}


def parse_prompt(prompt: str | Mapping[str, Any], defaults: MediaDefaults) -> PromptInput:
    """A prompt str or dict (prompt / prompt_token_ids / messages, multi_modal_data, mm_processor_kwargs, ...)
    -> PromptInput; media sources are decoded and preprocessed here (PromptError / MediaError on bad input)."""
    if isinstance(prompt, str):
        return PromptInput(text=prompt)
    if not isinstance(prompt, Mapping):
        raise PromptError(f"a prompt is a str or a dict, got {type(prompt).__name__}")
    if unknown := set(prompt) - PROMPT_KEYS:
        raise PromptError(f"unknown prompt keys {sorted(unknown)}; expected some of {sorted(PROMPT_KEYS)}")
    mm = dict(prompt.get("multi_modal_data") or {})
    if unknown := set(mm) - {"image", "video", "audio"}:
        raise PromptError(f"unknown multi_modal_data keys {sorted(unknown)}; expected image, video and/or audio")
    kw = dict(prompt.get("mm_processor_kwargs") or {})
    if unknown := set(kw) - IMAGE_KWARGS - VIDEO_KWARGS:
        raise PromptError(f"unknown mm_processor_kwargs {sorted(unknown)}")
    images = image_items(mm["image"], kw, defaults) if mm.get("image") is not None else []
    videos = video_items(mm["video"], kw, defaults) if mm.get("video") is not None else []
    audios = (audio_items(mm["audio"], defaults.audio, defaults.model_name) if mm.get("audio") is not None
              else [])
    return PromptInput(text=prompt.get("prompt"), token_ids=prompt.get("prompt_token_ids"),
                       messages=prompt.get("messages"), images=images, videos=videos,
                       media_tokens_preexpanded=bool(prompt.get("media_tokens_preexpanded", False)),
                       chat_template_kwargs=prompt.get("chat_template_kwargs"), cache_salt=prompt.get("cache_salt"),
                       audios=audios)
