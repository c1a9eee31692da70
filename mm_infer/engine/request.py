"""build_vlm_request: text, token ids or chat messages plus media become a VLMRequest (expanded ids, M-RoPE)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mm_infer.media.packed import PackedTensor
from mm_infer.prompt.mrope import get_mrope_positions
from mm_infer.prompt.placeholders import PlaceholderIds, PlaceholderRange, PromptError, expand_placeholders


@dataclass(frozen=True)
class MediaItem:
    """One image or video, ready for the vision encoder."""

    modality: str
    pixel_values: Tensor  # [t*h*w, C*T*ph*pw]
    grid_thw: tuple[int, int, int]
    content_hash: str
    second_per_grid_t: float | None = None


@dataclass
class VLMRequest:
    """A fully prepared prompt: expanded token ids, media in prompt order and M-RoPE positions."""

    prompt_token_ids: list[int]
    placeholders: list[PlaceholderRange]
    items: list[MediaItem]
    mrope_positions: Tensor  # [3, L] long
    mrope_delta: int  # decode position = sequence index + delta
    prompt_text: str | None = None

    @property
    def item_patches(self) -> list[int]:
        return [it.pixel_values.shape[0] for it in self.items]


def flat_token_ids(obj: Any) -> list[int]:
    """Token ids from any apply_chat_template/tokenizer return shape: list, nested list, dict, tensor."""
    if isinstance(obj, Mapping) or hasattr(obj, "keys"):
        if "input_ids" not in obj:
            raise PromptError(f"tokenizer output has no input_ids (keys: {list(obj.keys())})")
        obj = obj["input_ids"]
    if hasattr(obj, "tolist"):
        obj = obj.tolist()
    if isinstance(obj, (list, tuple)) and obj and isinstance(obj[0], (list, tuple)):
        if len(obj) != 1:
            raise PromptError(f"expected one tokenized conversation, got a batch of {len(obj)}")
        obj = obj[0]
    if not isinstance(obj, (list, tuple)) or not all(isinstance(t, int) for t in obj):
        raise PromptError(f"could not read token ids from tokenizer output of type {type(obj).__name__}")
    return [int(t) for t in obj]


def render_prompt(tokenizer: Any, *, prompt: str | None = None, prompt_token_ids: Sequence[int] | None = None,
                  messages: Sequence[Mapping[str, Any]] | None = None,
                  chat_template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """Exactly one of prompt / prompt_token_ids / messages -> token ids (placeholders not yet expanded)."""
    given = [name for name, v in (("prompt", prompt), ("prompt_token_ids", prompt_token_ids),
                                  ("messages", messages)) if v is not None]
    if len(given) != 1:
        raise PromptError(f"give exactly one of prompt, prompt_token_ids or messages (got {given or 'none'})")
    if prompt_token_ids is not None:
        ids = [int(t) for t in prompt_token_ids]
    elif prompt is not None:
        ids = flat_token_ids(tokenizer.encode(prompt))
    else:
        kwargs = {"add_generation_prompt": True, **(chat_template_kwargs or {})}
        ids = flat_token_ids(tokenizer.apply_chat_template(list(messages), tokenize=True, **kwargs))
    if not ids:
        raise PromptError("the prompt is empty")
    return ids


def _item_hashes(packed: PackedTensor) -> list[str]:
    if packed.content_hashes:
        return list(packed.content_hashes)
    out = []
    for part in packed.split():  # no upstream hash: digest the pixels and the grid
        h = hashlib.blake2b(part.pixel_values.float().contiguous().numpy().tobytes(), digest_size=16)
        h.update(repr(part.imgs_sizes.tolist()).encode())
        out.append(h.hexdigest())
    return out


def build_vlm_request(
    tokenizer: Any,
    ids: PlaceholderIds,
    *,
    prompt: str | None = None,
    prompt_token_ids: Sequence[int] | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
    images: PackedTensor | None = None,
    videos: PackedTensor | None = None,
    second_per_grid_ts: Sequence[float] | None = None,
    media_tokens_preexpanded: bool = False,
    merge_size: int = 2,
    tokens_per_second: float | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> VLMRequest:
    """Tokenize (or take ids), expand/check media placeholders, hash media and compute M-RoPE positions."""
    raw = render_prompt(tokenizer, prompt=prompt, prompt_token_ids=prompt_token_ids, messages=messages,
                        chat_template_kwargs=chat_template_kwargs)
    images = images if images is not None else PackedTensor.empty()
    videos = videos if videos is not None else PackedTensor.empty()
    seconds = list(second_per_grid_ts) if second_per_grid_ts is not None else [1.0] * len(videos)
    if len(seconds) != len(videos):
        raise PromptError(f"{len(seconds)} second_per_grid_ts values for {len(videos)} videos")
    hashes = {"image": _item_hashes(images), "video": _item_hashes(videos)}
    token_ids, ranges, order = expand_placeholders(
        raw, ids, image_tokens=images.tokens_per_item(merge_size), video_tokens=videos.tokens_per_item(merge_size),
        image_hashes=hashes["image"], video_hashes=hashes["video"], preexpanded=media_tokens_preexpanded)
    parts = {"image": images.split(), "video": videos.split()}
    items = [
        MediaItem(modality, parts[modality][k].pixel_values,
                  tuple(int(x) for x in parts[modality][k].imgs_sizes[0].tolist()),  # type: ignore[arg-type]
                  hashes[modality][k], seconds[k] if modality == "video" else None)
        for modality, k in order
    ]
    try:
        positions, delta = get_mrope_positions(
            token_ids, images.imgs_sizes, videos.imgs_sizes, image_token_id=ids.image_pad_id,
            video_token_id=ids.video_pad_id, vision_start_token_id=ids.vision_start_id,
            spatial_merge_size=merge_size, tokens_per_second=tokens_per_second,
            second_per_grid_ts=seconds if len(videos) else None)
    except ValueError as exc:
        raise PromptError(str(exc)) from exc
    return VLMRequest(token_ids, ranges, items, positions.to(torch.long), delta, prompt)
