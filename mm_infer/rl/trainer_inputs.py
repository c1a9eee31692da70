"""Trainer-side helpers: a rollout sample as HF Qwen2-VL inputs, and rollout/trainer logprob agreement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from mm_infer.prompt.request import VLMRequest

MM_TYPE = {"image": 1, "video": 2}


def hf_inputs(request: VLMRequest, completion: Sequence[int], *, image_pad_id: int, video_pad_id: int,
              second_per_grid_ts: bool = False) -> dict[str, Any]:
    """Keyword arguments for `Qwen2VLForConditionalGeneration.forward` on prompt + completion (batch of 1).

    Carries `mm_token_type_ids`: without it transformers 5 falls back to text-only positions. Set
    `second_per_grid_ts` for Qwen2.5-VL, whose video positions scale with it (Qwen2-VL refuses the key).
    """
    ids = torch.tensor(request.prompt_token_ids + list(completion), dtype=torch.long)  # [L]
    types = torch.zeros_like(ids)
    types[ids == image_pad_id] = MM_TYPE["image"]
    types[ids == video_pad_id] = MM_TYPE["video"]
    kw: dict[str, Any] = {"input_ids": ids[None], "attention_mask": torch.ones_like(ids)[None],
                          "mm_token_type_ids": types[None]}
    for modality, pixels_key, grid_key in (("image", "pixel_values", "image_grid_thw"),
                                           ("video", "pixel_values_videos", "video_grid_thw")):
        items = [it for it in request.items if it.modality == modality]
        if items:
            kw[pixels_key] = torch.cat([it.pixel_values for it in items])  # [P, 1176]
            kw[grid_key] = torch.tensor([it.grid_thw for it in items])  # [M, 3]
    videos = [it for it in request.items if it.modality == "video"]
    if second_per_grid_ts and videos:
        kw["second_per_grid_ts"] = torch.tensor([it.second_per_grid_t for it in videos])
    return kw


def completion_logprobs(logits: Tensor, token_ids: Sequence[int]) -> Tensor:
    """logits [1, L, V] of a teacher-forced forward -> float32 logprobs [G] of the last G tokens."""
    g = len(token_ids)
    logp = torch.log_softmax(logits[0, -g - 1 : -1].float(), dim=-1)  # [G, V]
    return logp.gather(1, torch.tensor(token_ids)[:, None]).squeeze(1)  # [G]


def masked_logprobs(logits: Tensor, token_ids: Sequence[int], mask: Sequence[int]) -> Tensor:
    """logits [1, L, V] over token_ids [L] -> float32 logprobs of the tokens where mask is 1 (mask[0] must be 0)."""
    ids = torch.tensor(token_ids)
    where = torch.tensor(mask, dtype=torch.bool).nonzero().squeeze(1)  # [M] positions of model tokens
    logp = torch.log_softmax(logits[0, where - 1].float(), dim=-1)  # [M, V]: each predicted by the previous row
    return logp.gather(1, ids[where][:, None]).squeeze(1)  # [M]


def token_mult_prob_error(rollout: Sequence[Tensor | Sequence[float]], trainer: Sequence[Tensor]) -> float:
    """Mean over all tokens of exp(|rollout logprob - trainer logprob|); 1.0 means identical."""
    diffs = [(torch.as_tensor(r, dtype=torch.float64) - t.double()).abs() for r, t in zip(rollout, trainer,
                                                                                         strict=True)]
    flat = torch.cat(diffs) if diffs else torch.zeros(0, dtype=torch.float64)
    return float(flat.exp().mean()) if flat.numel() else 1.0
