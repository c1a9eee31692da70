"""Qwen2-VL patch geometry and CLIP normalisation: the one definition mm_infer_kernels/ and mm_infer/media share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI CLIP, as Qwen2-VL's image processor
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
RESCALE = 1 / 255  # uint8 -> [0, 1]
CHANNELS = 3
NormBackend = Literal["torchvision", "pil"]
NORM_BACKENDS: tuple[str, ...] = ("torchvision", "pil")


@dataclass(frozen=True)
class PatchGeometry:
    """Patch sizes of the vision tower (Qwen2-VL / Qwen2.5-VL defaults)."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2

    @property
    def width(self) -> int:
        """Features per row: C * tp * p * p (1176 for Qwen2-VL)."""
        return CHANNELS * self.temporal_patch_size * self.patch_size * self.patch_size

    def grid(self, thw: Sequence[int]) -> tuple[int, int, int]:
        """Frame sizes (T, H, W) -> patch grid (t, h, w); odd T is padded by repeating the last frame."""
        t, h, w = thw
        tp, p = self.temporal_patch_size, self.patch_size
        return (t + tp - 1) // tp, h // p, w // p


@dataclass(frozen=True)
class Normalize:
    """uint8 -> float32 normalisation with the float arithmetic of one HF processor backend.

    torchvision: one fused float32 step (x - mean/rescale) / (std/rescale), i.e. mean*255 and std*255.
    pil: float32(float64(x) * rescale), then (x - mean) / std in float32.
    """

    mean: tuple[float, ...] = CLIP_MEAN
    std: tuple[float, ...] = CLIP_STD
    backend: NormBackend = "torchvision"
    rescale: float = RESCALE

    def table(self, device: torch.device | str) -> torch.Tensor:
        """[2, 3] float32 (subtrahend, divisor) per channel, rounded to float32 as HF does."""
        assert self.backend in NORM_BACKENDS, f"unknown normalisation backend {self.backend!r}"
        scale = 1.0 / self.rescale if self.backend == "torchvision" else 1.0
        return torch.stack([torch.tensor(self.mean) * scale, torch.tensor(self.std) * scale]).to(device)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Reference: uint8 [..., 3] channels-last -> float32 [..., 3]."""
        t = self.table(x.device)  # [2, C]
        v = x.float() if self.backend == "torchvision" else (x.double() * self.rescale).float()
        return (v - t[0]) / t[1]


QWEN2_VL = PatchGeometry()
CLIP = Normalize()
