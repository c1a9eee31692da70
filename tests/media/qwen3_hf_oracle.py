"""The HF Qwen3-VL processor as an oracle without torchvision: its own code, with torchvision's CPU ops stood in.

torchvision is not part of the project. On CPU its uint8 bicubic resize is torch's native antialiased uint8
kernel and its normalize is `(x - mean) / std` in float32 (../shared/golden/README.md: that reproduces the
golden Qwen2-VL files bit for bit), so those two ops are replaced by exactly that; everything else (frame
sampling, smart_resize, patchify, timestamps, placeholder text, token ids) is transformers' own code.
"""

from __future__ import annotations

import enum
import types
from contextlib import contextmanager
from pathlib import Path

import torch


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    LANCZOS = "lanczos"


def _resize(image: torch.Tensor, size, interpolation=InterpolationMode.BICUBIC, antialias: bool = True):
    assert interpolation is InterpolationMode.BICUBIC and image.dtype == torch.uint8, (interpolation, image.dtype)
    shape = image.shape
    flat = image.reshape(-1, *shape[-3:])  # [B, C, H, W]
    out = torch.nn.functional.interpolate(flat, size=list(size), mode="bicubic", align_corners=False,
                                          antialias=antialias)
    return out.reshape(*shape[:-2], *out.shape[-2:])


def _normalize(image: torch.Tensor, mean, std, inplace: bool = False) -> torch.Tensor:
    mean = torch.as_tensor(mean, dtype=image.dtype).view(-1, 1, 1)
    std = torch.as_tensor(std, dtype=image.dtype).view(-1, 1, 1)
    return (image - mean) / std


TVF = types.SimpleNamespace(InterpolationMode=InterpolationMode, resize=_resize, normalize=_normalize,
                            grayscale_to_rgb=lambda x: x if x.shape[-3] == 3 else x.expand(*x.shape[:-3], 3,
                                                                                               *x.shape[-2:]))


@contextmanager
def hf_processor(model_dir: Path):
    """Qwen3VLProcessor of `model_dir`: the PIL image processor, the (torchvision-only) video processor."""
    import transformers.image_processing_backends as backends
    import transformers.video_processing_utils as vpu
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    saved = {m: (getattr(m, "tvF", None), getattr(m, "pil_torch_interpolation_mapping", None)) for m in (backends, vpu)}
    for m in (backends, vpu):
        m.tvF = TVF
        m.pil_torch_interpolation_mapping = {3: InterpolationMode.BICUBIC}
    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
        proc = Qwen3VLProcessor.__new__(Qwen3VLProcessor)  # __init__ would look the classes up (torchvision-gated)
        proc.tokenizer, proc.chat_template = tok, tok.chat_template
        proc.image_processor = Qwen2VLImageProcessorPil.from_pretrained(model_dir)  # its module needs no torchvision
        proc.video_processor = Qwen3VLVideoProcessor.from_pretrained(model_dir)
        proc.image_token, proc.video_token = "<|image_pad|>", "<|video_pad|>"
        proc.vision_start_token, proc.vision_end_token = "<|vision_start|>", "<|vision_end|>"
        for name in ("image", "video", "vision_start", "vision_end"):
            setattr(proc, f"{name}_token_id", tok.convert_tokens_to_ids(getattr(proc, f"{name}_token")))
        yield proc
    finally:
        for m, (tvf, mapping) in saved.items():
            m.tvF, m.pil_torch_interpolation_mapping = tvf, mapping
