"""Normalisation and Qwen2-VL patchify: uint8 frames -> pixel_values rows [patches, C*tp*p*p]."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from kernels.fused_patchify import patch_rows
from kernels.geometry import (
    CLIP_MEAN,
    CLIP_STD,
    NORM_BACKENDS,
    QWEN2_VL,
    RESCALE,
    Normalize,
    NormBackend,
    PatchGeometry,
)

Backend = NormBackend
BACKENDS: tuple[str, ...] = NORM_BACKENDS


@dataclass(frozen=True)
class PatchSpec:
    """Geometry and normalisation constants of the Qwen2-VL vision input."""

    patch_size: int = QWEN2_VL.patch_size
    temporal_patch_size: int = QWEN2_VL.temporal_patch_size
    merge_size: int = QWEN2_VL.merge_size
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    rescale_factor: float = RESCALE

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @property
    def row_width(self) -> int:
        return self.geometry.width

    @property
    def geometry(self) -> PatchGeometry:
        """The kernels/ patch geometry of this spec."""
        return PatchGeometry(self.patch_size, self.temporal_patch_size, self.merge_size)

    def normalizer(self, backend: Backend) -> Normalize:
        """The kernels/ normalisation of this spec with `backend`'s float arithmetic."""
        return Normalize(self.image_mean, self.image_std, backend, self.rescale_factor)

    @staticmethod
    def from_config(cfg: Mapping[str, Any]) -> PatchSpec:
        """The spec a preprocessor_config.json describes (Qwen3-VL: patch 16, mean = std = 0.5); Qwen2-VL's defaults."""
        d = PatchSpec()
        return PatchSpec(int(cfg.get("patch_size", d.patch_size)),
                         int(cfg.get("temporal_patch_size", d.temporal_patch_size)),
                         int(cfg.get("merge_size", d.merge_size)), tuple(cfg.get("image_mean", d.image_mean)),
                         tuple(cfg.get("image_std", d.image_std)), float(cfg.get("rescale_factor", d.rescale_factor)))


DEFAULT_SPEC = PatchSpec()


def normalize(frames: torch.Tensor, backend: Backend, spec: PatchSpec = DEFAULT_SPEC) -> torch.Tensor:
    """uint8 [T, 3, H, W] -> float32 [T, 3, H, W], with each backend's exact float arithmetic (kernels' Normalize).

    torchvision: one fused step `(x - mean/rescale) / (std/rescale)` in float32.
    pil: `float32(float64(x) * rescale)`, then `(x - mean) / std` in float32.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend '{backend}', expected one of {BACKENDS}")
    return spec.normalizer(backend).apply(frames.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # [T, 3, H, W]


def patchify(frames: torch.Tensor, spec: PatchSpec = DEFAULT_SPEC) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """[T, C, H, W] -> (rows [gt*gh*gw, C*tp*p*p], grid (gt, gh, gw)) in Qwen2-VL row order (kernels' patch_rows)."""
    t, _, h, w = frames.shape
    if h % spec.factor or w % spec.factor:
        raise ValueError(f"frame size {h}x{w} is not a multiple of {spec.factor}")
    geometry = spec.geometry
    return patch_rows(frames, geometry), geometry.grid((t, h, w))


@lru_cache(maxsize=16)
def norm_table(norm: Normalize) -> np.ndarray:
    """float32 [3, 256]: `norm` applied to every uint8 value, so a gather replaces the arithmetic.

    Element-wise float arithmetic is deterministic, so the table reproduces the normalisation bit for bit.
    """
    values = torch.arange(256, dtype=torch.uint8).view(1, 256, 1).expand(1, 256, 3).contiguous()  # [1, 256, 3]
    return norm.apply(values)[0].t().numpy().copy()  # [3, 256]


def rows_by_table(frames: torch.Tensor, norm: Normalize, geometry: PatchGeometry) -> torch.Tensor:
    """uint8 [T, 3, H, W] -> float32 rows [patches, 3*tp*p*p]: one table gather per colour plane, then patch_rows.

    Equal to `patch_rows(normalised frames)` bit for bit; the lookup replaces 2-4 float passes with one gather
    over contiguous planes.
    """
    lut = norm_table(norm)
    src = np.ascontiguousarray(frames.numpy())  # [T, 3, H, W] uint8
    out = np.empty(src.shape, dtype=np.float32)
    for c in range(3):
        np.take(lut[c], src[:, c], out=out[:, c], mode="clip")
    return patch_rows(torch.from_numpy(out), geometry)


def frames_to_rows(frames: torch.Tensor, backend: Backend,
                   spec: PatchSpec = DEFAULT_SPEC) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """uint8 [T, 3, H, W] -> (float32 rows [patches, 3*tp*p*p], grid), equal to `patchify(normalize(frames))`."""
    t, _, h, w = frames.shape
    if h % spec.factor or w % spec.factor:
        raise ValueError(f"frame size {h}x{w} is not a multiple of {spec.factor}")
    return rows_by_table(frames, spec.normalizer(backend), spec.geometry), spec.geometry.grid((t, h, w))
