"""Normalisation and Qwen2-VL patchify: uint8 frames -> pixel_values rows [patches, C*tp*p*p]."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
import torch

Backend = Literal["torchvision", "pil"]
BACKENDS: tuple[str, ...] = ("torchvision", "pil")

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class PatchSpec:
    """Geometry and normalisation constants of the Qwen2-VL vision input."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, ...] = OPENAI_CLIP_MEAN
    image_std: tuple[float, ...] = OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @property
    def row_width(self) -> int:
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size


DEFAULT_SPEC = PatchSpec()


def normalize(frames: torch.Tensor, backend: Backend, spec: PatchSpec = DEFAULT_SPEC) -> torch.Tensor:
    """uint8 [T, 3, H, W] -> float32 [T, 3, H, W], with each backend's exact float arithmetic.

    torchvision: one fused step `(x - mean/rescale) / (std/rescale)` in float32.
    pil: `float32(float64(x) * rescale)`, then `(x - mean) / std` in float32.
    """
    if backend == "torchvision":
        mean = (torch.tensor(spec.image_mean) * (1.0 / spec.rescale_factor)).view(1, 3, 1, 1)
        std = (torch.tensor(spec.image_std) * (1.0 / spec.rescale_factor)).view(1, 3, 1, 1)
        return frames.to(torch.float32).sub_(mean).div_(std)
    if backend == "pil":
        mean = torch.from_numpy(np.array(spec.image_mean, dtype=np.float32)).view(1, 3, 1, 1)
        std = torch.from_numpy(np.array(spec.image_std, dtype=np.float32)).view(1, 3, 1, 1)
        x = (frames.to(torch.float64) * spec.rescale_factor).to(torch.float32)
        return x.sub_(mean).div_(std)
    raise ValueError(f"unknown backend '{backend}', expected one of {BACKENDS}")


def patchify(frames: torch.Tensor, spec: PatchSpec = DEFAULT_SPEC) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """[T, C, H, W] -> (rows [gt*gh*gw, C*tp*p*p], grid (gt, gh, gw)).

    T is padded up to a multiple of the temporal patch by repeating the last frame. Rows run over
    t, then merge blocks in raster order, then the merge×merge patches inside a block; features
    run over C, temporal, patch row, patch column.
    """
    t, c, h, w = frames.shape
    p, tp, m = spec.patch_size, spec.temporal_patch_size, spec.merge_size
    if h % (p * m) or w % (p * m):
        raise ValueError(f"frame size {h}x{w} is not a multiple of {p * m}")
    if t == 1:
        frames = frames.expand(tp, c, h, w)  # one picture fills the temporal patch: a view, no copy
        t = tp
    elif pad := -t % tp:
        frames = torch.cat([frames, frames[-1:].expand(pad, c, h, w)], dim=0)  # [T+pad, C, H, W]
        t += pad
    gt, gh, gw = t // tp, h // p, w // p
    x = frames.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # [gt, gh/m, gw/m, m, m, C, tp, p, p]
    return x.reshape(gt * gh * gw, c * tp * p * p), (gt, gh, gw)


@lru_cache(maxsize=16)
def normalization_lut(backend: Backend, spec: PatchSpec = DEFAULT_SPEC) -> np.ndarray:
    """float32 [3, 256]: `normalize` applied to every uint8 value, so a gather replaces the arithmetic.

    Element-wise float arithmetic is deterministic, so the table reproduces `normalize` bit for bit.
    """
    values = torch.arange(256, dtype=torch.uint8).view(1, 1, 1, 256).expand(1, 3, 1, 256).contiguous()
    return normalize(values, backend, spec)[0, :, 0, :].numpy().copy()


def frames_to_rows(frames: torch.Tensor, backend: Backend,
                   spec: PatchSpec = DEFAULT_SPEC) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """uint8 [T, 3, H, W] -> (float32 rows [patches, 3*tp*p*p], grid): table lookup per colour plane, then patchify.

    Equal to `patchify(normalize(frames))` bit for bit; the lookup replaces 2-4 float passes with one gather
    over contiguous planes.
    """
    lut = normalization_lut(backend, spec)
    src = np.ascontiguousarray(frames.numpy())  # [T, 3, H, W] uint8
    out = np.empty(src.shape, dtype=np.float32)
    for c in range(3):
        np.take(lut[c], src[:, c], out=out[:, c], mode="clip")
    return patchify(torch.from_numpy(out), spec)
