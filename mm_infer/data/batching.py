"""Examples to one right-padded HF Qwen2-VL training batch (input ids, labels, mm_token_type_ids, pixels)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mm_infer.data.chat import IGNORE, Example
from mm_infer.media import PackedTensor


def _pad(rows: Sequence[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)  # [B, L]


def collate(examples: Sequence[Example], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Keyword arguments for Qwen2VLForConditionalGeneration.forward, media packed in example order."""
    ids = [e.input_ids for e in examples]
    batch = {
        "input_ids": _pad(ids, pad_token_id),
        "attention_mask": _pad([[1] * len(r) for r in ids], 0),
        "labels": _pad([e.labels for e in examples], IGNORE),
        "mm_token_type_ids": _pad([e.mm_token_type_ids for e in examples], 0),
    }
    for modality, pixels_key, grid_key in (("image", "pixel_values", "image_grid_thw"),
                                           ("video", "pixel_values_videos", "video_grid_thw")):
        items = [e.media for e in examples if e.modality == modality]
        if items:
            packed = PackedTensor.concat(items)
            batch[pixels_key] = packed.pixel_values
            batch[grid_key] = packed.imgs_sizes
    return batch
