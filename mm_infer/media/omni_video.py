"""Nemotron Omni videos: HF 5.24's NemotronH_Omni_Reasoning_V3VideoProcessor tile, resize, tubelets and sampling."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mm_infer.media.errors import MediaDecodeError, MediaInvalidError
from mm_infer.media.limits import DEFAULT_LIMITS, MediaLimits
from mm_infer.media.omni_image import resize_float
from mm_infer.media.sources import EncodedMedia
from mm_infer.media.video import iter_frames

OMNI_VIDEO_PROCESSOR = "NemotronH_Omni_Reasoning_V3VideoProcessor"


@dataclass(frozen=True)
class OmniVideoSpec:
    """video_preprocessor_config.json of a Nemotron Omni checkpoint (HF's class defaults where a key is absent)."""

    norm_mean: tuple[float, ...]
    norm_std: tuple[float, ...]
    patch_size: int = 16
    merge_size: int = 2  # round(1 / downsample_ratio)
    target_patches: int = 1024  # video_target_num_patches
    maintain_aspect_ratio: bool = True
    temporal_patch_size: int = 2
    do_sample_frames: bool = False
    fps: float | None = None  # the sampler's target fps (with do_sample_frames)
    num_frames: int | None = None

    @staticmethod
    def from_config(cfg: Mapping[str, Any]) -> OmniVideoSpec:
        """HF has no default mean/std for videos: a config without norm_mean / norm_std is refused."""
        if cfg.get("norm_mean") is None or cfg.get("norm_std") is None:
            raise ValueError("video_preprocessor_config.json has no norm_mean / norm_std (HF's video processor "
                             "needs them)")
        fps, num = cfg.get("fps"), cfg.get("num_frames")
        return OmniVideoSpec(tuple(float(x) for x in cfg["norm_mean"]), tuple(float(x) for x in cfg["norm_std"]),
                             int(cfg.get("patch_size", 16)), round(1 / float(cfg.get("downsample_ratio", 0.5))),
                             int(cfg.get("video_target_num_patches", 1024)),
                             bool(cfg.get("video_maintain_aspect_ratio", True)),
                             int(cfg.get("temporal_patch_size", 2)), bool(cfg.get("do_sample_frames") or False),
                             None if fps is None else float(fps), None if num is None else int(num))

    @property
    def row_width(self) -> int:
        return self.temporal_patch_size * 3 * self.patch_size**2


def omni_tile(height: int, width: int, spec: OmniVideoSpec) -> tuple[int, int]:
    """HF's _compute_target_patches as (gh, gw): an aspect-keeping tile near target_patches, sides multiples of
    the merge size (banker's `round`)."""
    target, d = spec.target_patches, spec.merge_size
    if not spec.maintain_aspect_ratio:
        side = max(d, (int(math.sqrt(target)) // d) * d)
        return side, side
    aspect = width / max(height, 1)
    ph, pw = max(round(math.sqrt(target / aspect)), 1), max(round(math.sqrt(target * aspect)), 1)
    if d > 1:
        ph_up, pw_up = ph + (-ph % d), pw + (-pw % d)
        if ph_up * pw_up <= target:
            return ph_up, pw_up
        return max(d, ph - ph % d), max(d, pw - pw % d)
    return ph, pw


def omni_frames(frames: torch.Tensor, size: tuple[int, int], spec: OmniVideoSpec) -> torch.Tensor:
    """uint8 [T, 3, H, W] -> float32 [T, 3, h, w]: float bicubic antialias resize, then (x/255 - mean)/std
    (not fused, as HF's video processor)."""
    mean = torch.tensor(spec.norm_mean).view(1, 3, 1, 1)
    std = torch.tensor(spec.norm_std).view(1, 3, 1, 1)
    x = resize_float(frames.to(torch.float32), size)
    return (x / 255.0 - mean) / std


def tubelet_rows(frames: torch.Tensor, spec: OmniVideoSpec) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """float [T, C, H, W] -> (rows [n_tub*gh*gw, tp*C*p*p], grid (n_tub, gh, gw)).

    The last frame is repeated up to a multiple of tp; a tubelet stacks its frames on channels (t*C + c), and a
    row holds one patch of a tubelet laid out (t*C + c, py, px)."""
    t, c, h, w = frames.shape
    tp, p = spec.temporal_patch_size, spec.patch_size
    if t % tp:
        frames = torch.cat([frames, frames[-1:].expand(tp - t % tp, -1, -1, -1)])
    n, gh, gw = frames.shape[0] // tp, h // p, w // p
    x = frames.reshape(n, tp * c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5)  # [n, gh, gw, tp*C, p, p]
    return x.reshape(n * gh * gw, tp * c * p * p), (n, gh, gw)


def omni_video_rows(frames: torch.Tensor, spec: OmniVideoSpec) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """uint8 [T, 3, H, W] -> (float32 rows, grid (n_tub, gh, gw)), bit-exact with HF."""
    if frames.shape[0] < 1:
        raise MediaInvalidError("video has 0 frames")
    gh, gw = omni_tile(frames.shape[2], frames.shape[3], spec)
    p = spec.patch_size
    return tubelet_rows(omni_frames(frames, (gh * p, gw * p), spec), spec)


def decode_omni(encoded: EncodedMedia, indices: Sequence[int], decoder: str, spec: OmniVideoSpec,
                limits: MediaLimits = DEFAULT_LIMITS) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """The frames at `indices` (in that order) -> (rows, grid); each frame is resized and normalised as it is
    decoded, so only the float output at the tile size and one source frame are held."""
    positions: dict[int, list[int]] = {}
    for pos, idx in enumerate(indices):
        positions.setdefault(idx, []).append(pos)
    out: torch.Tensor | None = None
    source: tuple[int, int] = (0, 0)
    for idx, rgb in iter_frames(encoded, list(indices), decoder, limits):
        if out is None:
            source = rgb.shape[:2]
            gh, gw = omni_tile(*source, spec)
            out = torch.empty(len(indices), 3, gh * spec.patch_size, gw * spec.patch_size)  # [T, 3, h, w]
        elif rgb.shape[:2] != source:
            raise MediaDecodeError(f"{encoded.origin}: frame {idx} is {rgb.shape[1]}x{rgb.shape[0]}, but earlier "
                                   f"sampled frames are {source[1]}x{source[0]} (size changes mid-stream)")
        frame = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1)[None]  # [1, 3, H, W] uint8
        small = omni_frames(frame, tuple(out.shape[2:]), spec)[0]
        for pos in positions[idx]:
            out[pos] = small
    if out is None:
        raise MediaDecodeError(f"{encoded.origin}: no frames decoded")
    return tubelet_rows(out, spec)


def frame_seconds(indices: Sequence[int], fps: float | None, listed: bool = False) -> list[float] | None:
    """Each frame's time as HF's processor labels it: index * int(1000 / fps) ms for a decoded file (its metadata
    holds frame indices), k / fps for frames given as arrays; None without an fps ("Frame k" labels)."""
    if not fps or fps <= 0:
        return None
    if listed:
        return [k / fps for k in range(len(indices))]
    step_ms = int(1000.0 / fps)
    return [int(i) * step_ms / 1000.0 for i in indices]
