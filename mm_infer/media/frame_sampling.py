"""Frame samplers: which frame indices of a video to decode (HF processors, vLLM, qwen-vl-utils rules)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch

from mm_infer.media.errors import MediaInvalidError, MediaTooLargeError

Sampler = Literal["hf", "vllm", "qwen", "qwen3", "hf_base"]
SAMPLERS: tuple[str, ...] = ("hf", "vllm", "qwen", "qwen3", "hf_base")

QWEN_MIN_FRAMES = 4
QWEN_MAX_FRAMES = 768
VLLM_MAX_FPS = 30  # vLLM's Qwen video loaders sample at most 30 frames per second


def _round_by(x: float, f: int) -> int:
    return round(x / f) * f


def _floor_by(x: float, f: int) -> int:
    return math.floor(x / f) * f


def _ceil_by(x: float, f: int) -> int:
    return math.ceil(x / f) * f


@dataclass(frozen=True)
class FrameRule:
    """What a sampler is given: the clip (total frames, source fps) and the request's wishes."""

    total: int
    video_fps: float
    fps: float | None = 2.0  # None: no target rate (the hf_base rule then keeps every frame)
    num_frames: int | None = None
    factor: int = 2  # the temporal patch: sampled counts are multiples of it (hf, qwen)
    min_frames: int = QWEN_MIN_FRAMES
    max_frames: int = QWEN_MAX_FRAMES


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
        raise _count_error(n, total, factor, num_frames)
    return int(n)


def _count_error(n: int, total: int, factor: int, num_frames: int | None) -> MediaInvalidError:
    """Why n frames cannot be sampled from `total`, in the terms of what the request sent."""
    head = f"cannot sample {n} frames from a video of {total} frame{'' if total == 1 else 's'}"
    if num_frames is not None and n < factor:
        why = (f"num_frames {num_frames} rounds to {n} (frames are sampled in multiples of the temporal patch, "
               f"{factor}); ask for at least {factor}")
    elif total < factor:
        why = (f"one temporal patch needs {factor} frames (an image sent as a video? send it as image_url)")
    elif num_frames is not None and n > total:
        why = f"num_frames {num_frames} is more than the video has"
    else:
        why = f"need between {factor} and {total}"
    return MediaInvalidError(f"{head}: {why}")


def _qwen(r: FrameRule) -> list[int]:
    """qwen-vl-utils: linspace(0, total - 1, n).round() over smart_nframes' count."""
    n = qwen_num_frames(r.total, r.video_fps, fps=r.fps, num_frames=r.num_frames, factor=r.factor,
                        min_frames=r.min_frames, max_frames=r.max_frames)
    return torch.linspace(0, r.total - 1, n).round().long().tolist()


def _hf_count(r: FrameRule) -> int:
    """Qwen2VLVideoProcessor.sample_frames' frame count: num_frames rounded to the patch, else the fps rule."""
    if r.num_frames is not None:
        n = _round_by(r.num_frames, r.factor)
    else:
        hi = _floor_by(min(r.max_frames, r.total), r.factor)
        n = _floor_by(min(max(r.total / r.video_fps * r.fps, r.min_frames), hi, r.total), r.factor)
    if not 0 < n <= r.total:
        raise _count_error(n, r.total, r.factor, r.num_frames)
    return n


def _arange_indices(total: int, n: int) -> list[int]:
    """HF's float32 torch.arange(0, total, total / n).int(). Its step can overshoot to an index == total (one
    index more than n): HF then raises IndexError; vLLM clamps it to the last frame, and so do we."""
    return torch.arange(0, total, total / n).int().clamp(max=total - 1).tolist()


def _hf(r: FrameRule) -> list[int]:
    """transformers' Qwen2VLVideoProcessor.sample_frames (do_sample_frames=True)."""
    return _arange_indices(r.total, _hf_count(r))


def _qwen3(r: FrameRule) -> list[int]:
    """transformers' Qwen3VLVideoProcessor.sample_frames: no rounding to the temporal patch."""
    n = r.num_frames if r.num_frames is not None else min(max(int(r.total / r.video_fps * r.fps), r.min_frames),
                                                          r.max_frames, r.total)
    if n < 1:
        raise MediaInvalidError(f"num_frames must be positive, got {n}")
    return np.linspace(0, r.total - 1, n).round().astype(int).tolist()


def _hf_base(r: FrameRule) -> list[int]:
    """transformers' default_sample_indices_fn (BaseVideoProcessor.sample_frames; Nemotron Omni): n = num_frames,
    else max(1, int(total / video_fps * fps)), then arange(n) * total // n; every frame when neither is given.
    num_frames wins over fps (HF refuses both)."""
    n = r.num_frames
    if n is None and r.fps is not None:
        n = max(1, int(r.total / r.video_fps * r.fps))
    if n is None:
        return list(range(r.total))
    if not 0 < n <= r.total:
        raise MediaInvalidError(f"cannot sample {n} frames from a video of {r.total} frames")
    return (np.arange(n, dtype=np.int64) * r.total // n).tolist()


def _vllm(r: FrameRule, family: str) -> list[int]:
    """vLLM 0.32's Qwen2VLVideoBackend / Qwen3VLVideoBackend: the HF rule at min(fps, 30), num_frames ignored."""
    fps_driven = replace(r, fps=min(r.fps, VLLM_MAX_FPS), num_frames=None)
    return _qwen3(fps_driven) if family == "qwen3" else _hf(fps_driven)


def sample_indices(sampler: str, total: int, video_fps: float, *, fps: float | None = 2.0,
                   num_frames: int | None = None, factor: int = 2, min_frames: int = QWEN_MIN_FRAMES,
                   max_frames: int = QWEN_MAX_FRAMES, family: str = "qwen2") -> list[int]:
    """Indices into the decoded frames of a video with `total` frames at `video_fps`."""
    if total < 1:
        raise MediaInvalidError("video has 0 frames")
    if video_fps <= 0 and num_frames is None and fps is not None:  # probe() refuses such files
        raise MediaInvalidError("the video reports no frame rate: give num_frames or frame_indices")
    rule = FrameRule(total, video_fps, fps, num_frames, factor, min_frames, max_frames)
    if sampler == "vllm":
        return _vllm(rule, family)
    pick = {"hf": _hf, "qwen": _qwen, "qwen3": _qwen3, "hf_base": _hf_base}.get(sampler)
    if pick is None:
        raise MediaInvalidError(f"unknown frame sampler '{sampler}', expected one of {SAMPLERS}")
    return pick(rule)


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
