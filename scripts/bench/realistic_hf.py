"""HF's side of realistic.py's image prompt: its processor (or, without torchvision, its two halves)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def hf_processor(model: Path) -> tuple[Any, str]:
    """AutoProcessor, or (it needs torchvision for the video processor) HF's PIL image processor + tokenizer."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    try:
        return AutoProcessor.from_pretrained(str(model)), "AutoProcessor + apply_chat_template"
    except (ImportError, AttributeError, ValueError) as exc:
        pair = (AutoImageProcessor.from_pretrained(str(model)), AutoTokenizer.from_pretrained(str(model)))
        why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:70]}"
        return pair, f"AutoImageProcessor + tokenizer chat template, pads expanded as the processor does ({why})"


def hf_image_inputs(processor: Any, config: Any, image_path: Path, messages: list) -> dict[str, Any]:
    """The image prompt through HF: chat template, image processor, one image pad per merged patch."""
    from PIL import Image

    image = Image.open(image_path).convert("RGB")
    if not isinstance(processor, tuple):
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return dict(processor(text=[text], images=[image], return_tensors="pt"))
    image_processor, tokenizer = processor  # what Qwen2VLProcessor.__call__ does, from its two halves
    pixels = dict(image_processor(images=[image], return_tensors="pt"))
    pads = int(pixels["image_grid_thw"].prod()) // config.vision_config.spatial_merge_size ** 2
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer([text.replace("<|image_pad|>", "<|image_pad|>" * pads)], return_tensors="pt")["input_ids"]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "mm_token_type_ids": (ids == config.image_token_id).long(), **pixels}
