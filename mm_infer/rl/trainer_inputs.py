"""Trainer-side helpers: a rollout sample as HF inputs (Qwen2-VL family or Nemotron Omni), and rollout/trainer
logprob agreement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from mm_infer.models.config import ModelConfig
from mm_infer.prompt.request import MediaItem, VLMRequest

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


def omni_hf_inputs(request: VLMRequest, completion: Sequence[int], *, patch_size: int = 16,
                   temporal_patch_size: int = 2) -> dict[str, Any]:
    """Keyword arguments for HF's `NemotronH_Omni_Reasoning_V3ForConditionalGeneration.forward` on prompt +
    completion (batch of 1): images as `pixel_values` rows + `image_grid_hw`, videos as `pixel_values_videos`
    [num_videos, tubelets, T*C, H, W]. No M-RoPE and no token types: the LM takes plain positions.

    HF scatters image and video features alike into every `<image>` token of the prompt and checks the count per
    modality, so one forward takes images or videos, not both; HF also stacks videos, so they must share a shape."""
    ids = torch.tensor(request.prompt_token_ids + list(completion), dtype=torch.long)  # [L]
    kw: dict[str, Any] = {"input_ids": ids[None], "attention_mask": torch.ones_like(ids)[None]}
    images = [it for it in request.items if it.modality == "image"]
    videos = [it for it in request.items if it.modality == "video"]
    if images and videos:
        raise ValueError("Nemotron Omni: HF's forward cannot take images and videos together (it scatters both into "
                         "the shared <image> token and checks each modality's count against all of them); "
                         "give the trainer one modality per sample")
    if images:
        kw["pixel_values"] = torch.cat([it.pixel_values for it in images])  # [P, C*p*p]
        kw["image_grid_hw"] = torch.tensor([it.grid_thw[1:] for it in images])  # [M, 2]
    if videos:
        if len({it.grid_thw for it in videos}) > 1:
            raise ValueError(f"Nemotron Omni: HF stacks the videos of one forward, so they must share one grid; got "
                             f"{[it.grid_thw for it in videos]}")
        kw["pixel_values_videos"] = torch.stack([_tubelets(it, patch_size, temporal_patch_size) for it in videos])
    if audios := [it for it in request.items if it.modality == "audio"]:
        kw |= _audio_features(audios)
    return kw


def _audio_features(audios: Sequence[MediaItem]) -> dict[str, Tensor]:
    """The clips' mel features [F_i, mel] (F_i - 1 valid frames each, as HF's extractor makes them) padded together
    with zeros, as HF's processor pads one request's clips: input_features [B, F, mel], input_features_mask [B, F].
    (HF's last kept row of a clip whose valid frames are a multiple of 8 depends on its neighbours; the engine
    encodes each clip alone, so with several clips that row may differ by design.)"""
    width = max(it.pixel_values.shape[0] for it in audios)
    feats = torch.zeros(len(audios), width, audios[0].pixel_values.shape[1])
    mask = torch.zeros(len(audios), width, dtype=torch.long)
    for i, it in enumerate(audios):
        f = it.pixel_values.float()  # [F_i, mel]
        feats[i, :f.shape[0]] = f
        mask[i, :f.shape[0] - 1] = 1
    return {"input_features": feats, "input_features_mask": mask}


def _tubelets(item: MediaItem, patch: int, temporal: int) -> Tensor:
    """A video's rows [n*gh*gw, T*C*p*p] (row layout (t*C + c, py, px)) -> HF's tubelets [n, T*C, gh*p, gw*p]."""
    n, gh, gw = item.grid_thw
    rows = item.pixel_values
    ch = rows.shape[1] // patch**2
    if ch * patch**2 != rows.shape[1] or ch % temporal:
        raise ValueError(f"video rows of width {rows.shape[1]} are not T*C*{patch}*{patch} with T={temporal}")
    x = rows.reshape(n, gh, gw, ch, patch, patch).permute(0, 3, 1, 4, 2, 5)  # [n, T*C, gh, p, gw, p]
    return x.reshape(n, ch, gh * patch, gw * patch)


def trainer_hf_inputs(config: ModelConfig, request: VLMRequest, completion: Sequence[int]) -> dict[str, Any]:
    """HF forward kwargs for this checkpoint's family (config: `mm_infer.models.config.load_config(model_dir)`)."""
    if config.kind == "nemotron_h_omni":
        return omni_hf_inputs(request, completion, patch_size=config.vision.patch_size,
                              temporal_patch_size=config.vision.temporal_patch_size)
    return hf_inputs(request, completion, image_pad_id=config.image_token_id, video_pad_id=config.video_token_id,
                     second_per_grid_ts=config.kind == "qwen2_5_vl")


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
