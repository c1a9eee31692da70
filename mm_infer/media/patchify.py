"""Normalisation and Qwen2-VL patchify: uint8 frames -> pixel_values rows [patches, C*tp*p*p]."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from mm_infer_kernels.fused_patchify import patch_rows
from mm_infer_kernels.geometry import (
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
        """The mm_infer_kernels/ patch geometry of this spec."""
        return PatchGeometry(self.patch_size, self.temporal_patch_size, self.merge_size)

    def normalizer(self, backend: Backend) -> Normalize:
        """The mm_infer_kernels/ normalisation of this spec with `backend`'s float arithmetic."""
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


def new_rows(rows: int, width: int) -> torch.Tensor:
    """Uninitialised float32 [rows, width] in numpy's memory: numpy asks for transparent huge pages from 4 MB up,
    so first touch costs ~40 page faults per 1024x768 image's 18.8 MB instead of torch.empty's ~4600 (2.1 against
    5.8 ms per image measured on a batch of 10)."""
    return torch.from_numpy(np.empty((rows, width), dtype=np.float32))


def rows_by_table(frames: torch.Tensor, norm: Normalize, geometry: PatchGeometry,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 [T, 3, H, W] -> float32 rows [patches, 3*tp*p*p], into `out` when given (else a new tensor).

    Equal to `patch_rows(norm.apply(frames))` bit for bit (the table holds `norm.apply` of every uint8 value).
    One band of merge blocks (m*p pixel rows of a frame) at a time: a table gather per colour plane fills a
    cache-sized scratch, and one copy puts it in row order, once into every temporal slot a frame fills (a
    picture, or the padded last frame of an odd clip, fills both). Each output byte is written once, and no
    frame-sized float intermediate exists. numpy only: the same single-threaded pass whatever
    torch.get_num_threads() says (torch's threaded permute copy was what made the rows' time depend on it).
    """
    t, c, h, w = frames.shape
    p, tp, m = geometry.patch_size, geometry.temporal_patch_size, geometry.merge_size
    if h % (p * m) or w % (p * m):
        raise ValueError(f"frame size {h}x{w} is not a multiple of {p * m}")
    gt, gh, gw = geometry.grid((t, h, w))
    if out is None:
        out = new_rows(gt * gh * gw, geometry.width)
    elif out.shape != (gt * gh * gw, geometry.width) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous float32 [{gt * gh * gw}, {geometry.width}], got {out.dtype} "
                         f"{tuple(out.shape)}")
    lut = norm_table(norm)  # [3, 256]
    src = np.ascontiguousarray(frames.numpy())  # [T, 3, H, W] uint8
    dst = out.numpy().reshape(gt, gh // m, gw // m, m, m, c, tp, p, p)
    band = m * p
    scratch = np.empty((tp, c, band, w), dtype=np.float32)  # one band of each frame of a temporal patch
    for g in range(gt):
        picks = [min(g * tp + k, t - 1) for k in range(tp)]  # frame index per temporal slot
        picks = picks[:1] if len(set(picks)) == 1 else picks  # one frame in every slot: gather it once
        for b in range(gh // m):
            for k, f in enumerate(picks):
                for ch in range(c):
                    np.take(lut[ch], src[f, ch, b * band:(b + 1) * band], out=scratch[k, ch], mode="clip")
            s = scratch[:len(picks)].reshape(len(picks), c, m, p, gw // m, m, p)
            np.copyto(dst[g, b], s.transpose(4, 2, 5, 1, 0, 3, 6))  # [gw/m, m, m, c, slots, p, p]; 1 slot broadcasts
    return out


def items_rows(frames: Sequence[torch.Tensor], norm: Normalize, geometry: PatchGeometry) -> torch.Tensor:
    """Items' uint8 [T, 3, H, W] frames -> their rows concatenated [sum patches, width], written once in place."""
    counts = [math.prod(geometry.grid((f.shape[0], f.shape[2], f.shape[3]))) for f in frames]
    out = new_rows(sum(counts), geometry.width)  # [rows, width]
    start = 0
    for f, n in zip(frames, counts, strict=True):
        rows_by_table(f, norm, geometry, out[start:start + n])
        start += n
    return out


def frames_to_rows(frames: torch.Tensor, backend: Backend,
                   spec: PatchSpec = DEFAULT_SPEC) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """uint8 [T, 3, H, W] -> (float32 rows [patches, 3*tp*p*p], grid), equal to `patchify(normalize(frames))`."""
    t, _, h, w = frames.shape
    if h % spec.factor or w % spec.factor:
        raise ValueError(f"frame size {h}x{w} is not a multiple of {spec.factor}")
    return rows_by_table(frames, spec.normalizer(backend), spec.geometry), spec.geometry.grid((t, h, w))
