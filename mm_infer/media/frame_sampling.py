"""Frame samplers: which frame indices of a video to decode (qwen-vl-utils, HF, vLLM rules)."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch

from mm_infer.media.errors import MediaInvalidError, MediaTooLargeError

Sampler = Literal["qwen", "hf", "vllm", "qwen3"]
SAMPLERS: tuple[str, ...] = ("qwen", "hf", "vllm", "qwen3")

QWEN_MIN_FRAMES = 4
QWEN_MAX_FRAMES = 768
VLLM_DEFAULT_FRAMES = 32


def _round_by(x: float, f: int) -> int:
    return round(x / f) * f


def _floor_by(x: float, f: int) -> int:
    return math.floor(x / f) * f


def _ceil_by(x: float, f: int) -> int:
    return math.ceil(x / f) * f


def qwen_num_frames(total: int, video_fps: float, *, fps: float = 2.0, num_frames: int | None = None,
                    factor: int = 2, min_frames: int = QWEN_MIN_FRAMES, max_frames: int = QWEN_MAX_FRAMES) -> int:
    """qwen-vl-utils `smart_nframes`: target fps, clamped to [min, min(max, total)], a multiple of `factor`."""
    if num_frames is not None:
        n = _round_by(num_frames, factor)
    else:
        lo = _ceil_by(min_frames, factor)
        hi = _floor_by(min(max_frames, total), factor)
        n = total / video_fps * fps
        n = _floor_by(min(max(n, lo), hi, total), factor)
    if not (factor <= n <= total):
        raise MediaInvalidError(f"cannot sample {n} frames from a video of {total} frames "
                                f"(need between {factor} and {total})")
    return int(n)


def sample_indices(sampler: str, total: int, video_fps: float, *, fps: float = 2.0, num_frames: int | None = None,
                   factor: int = 2, max_frames: int = QWEN_MAX_FRAMES) -> list[int]:
    """Indices into the decoded frames of a video with `total` frames at `video_fps`."""
    if total < 1:
        raise MediaInvalidError("video has 0 frames")
    if sampler == "qwen":
        n = qwen_num_frames(total, video_fps, fps=fps, num_frames=num_frames, factor=factor, max_frames=max_frames)
        return torch.linspace(0, total - 1, n).round().long().tolist()
    if sampler == "hf":
        if num_frames is not None:
            n = _round_by(num_frames, factor)
        else:
            hi = _floor_by(min(max_frames, total), factor)
            n = _floor_by(min(max(total / video_fps * fps, QWEN_MIN_FRAMES), hi, total), factor)
        if n < 1 or n > total:
            raise MediaInvalidError(f"cannot sample {n} frames from a video of {total} frames")
        return torch.arange(0, total, total / n).int().tolist()
    if sampler == "qwen3":  # transformers' Qwen3VLVideoProcessor.sample_frames: no rounding to the temporal patch
        n = num_frames if num_frames is not None else min(max(int(total / video_fps * fps), QWEN_MIN_FRAMES),
                                                          max_frames, total)
        if n < 1:
            raise MediaInvalidError(f"num_frames must be positive, got {n}")
        return np.linspace(0, total - 1, n).round().astype(int).tolist()
    if sampler == "vllm":
        n = num_frames if num_frames is not None else VLLM_DEFAULT_FRAMES
        if n < 1:
            raise MediaInvalidError(f"num_frames must be positive, got {n}")
        if n >= total:
            return list(range(total))
        return np.linspace(0, total - 1, n, dtype=int).tolist()
    raise MediaInvalidError(f"unknown frame sampler '{sampler}', expected one of {SAMPLERS}")


def frame_timestamps(indices: list[int], fps: float, temporal_patch: int = 2) -> list[float]:
    """Seconds of each temporal patch, as Qwen3VLProcessor: indices padded with the last one to a multiple of the
    patch, then the mean of each patch's first and last frame time (index / container fps)."""
    idx = list(indices) + [indices[-1]] * (-len(indices) % temporal_patch)
    seconds = [i / fps for i in idx]
    return [(seconds[i] + seconds[i + temporal_patch - 1]) / 2 for i in range(0, len(seconds), temporal_patch)]


def timestamp_text(seconds: float) -> str:
    """The text Qwen3VLProcessor writes before a temporal patch."""
    return f"<{seconds:.1f} seconds>"


def check_indices(indices: list[int], total: int, *, max_sampled: int) -> list[int]:
    """Validate caller-given frame indices against the video's frame count and the sampling cap."""
    if not indices:
        raise MediaInvalidError("frame_indices is empty")
    if len(indices) > max_sampled:
        raise MediaTooLargeError(f"{len(indices)} frames requested, over the limit of {max_sampled}")
    bad = [i for i in indices if not 0 <= int(i) < total]
    if bad:
        raise MediaInvalidError(f"frame indices {bad[:5]} out of range for a video of {total} frames")
    return [int(i) for i in indices]
