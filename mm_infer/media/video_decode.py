"""A video's sampled frames decoded straight to their target size: the full-resolution stack is never held."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from PIL import Image

from mm_infer.media.errors import MediaDecodeError, MediaTooLargeError
from mm_infer.media.limits import DEFAULT_LIMITS, MediaLimits
from mm_infer.media.resize import resize_frames_torch, resize_image_pil
from mm_infer.media.sources import EncodedMedia
from mm_infer.media.video import iter_frames

TargetSize = Callable[[int, int], tuple[int, int]]  # (height, width) of the source -> (h, w) to resize to


def resize_frame(rgb: np.ndarray, size: tuple[int, int], backend: str) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [h, w, 3], by the same op, dtype and rounding the whole-stack resize uses.

    torch's uint8 antialiased bicubic and PIL's bicubic resize each frame on its own, so one frame at a
    time gives the bytes the [T, 3, H, W] call gives (tests/media/test_video_memory.py checks it).
    """
    if backend == "pil":
        return resize_image_pil(Image.fromarray(rgb), size)
    x = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1)[None]  # [1, 3, H, W], channels-last strides
    return resize_frames_torch(x, size)[0].permute(1, 2, 0).numpy()  # [h, w, 3]


def decode_resized(encoded: EncodedMedia, indices: list[int], decoder: str, target: TargetSize, backend: str,
                   limits: MediaLimits = DEFAULT_LIMITS) -> torch.Tensor:
    """Frames at `indices`, in the order asked, as uint8 [T, 3, h, w] at `target(H, W)` of the decoded size.

    Each frame is resized as soon as it is decoded; a frame repeated in `indices` is decoded and resized once.
    Holds the [T, 3, h, w] output plus one source frame, never [T, H, W, 3].
    """
    positions: dict[int, list[int]] = {}
    for pos, idx in enumerate(indices):
        positions.setdefault(idx, []).append(pos)
    out: np.ndarray | None = None
    source: tuple[int, int] = (0, 0)
    for idx, rgb in iter_frames(encoded, indices, decoder, limits):
        if out is None:
            source = rgb.shape[:2]
            _check_area(encoded.origin, source, limits)
            out = np.empty((len(indices), 3, *target(*source)), dtype=np.uint8)  # [T, 3, h, w]
        elif rgb.shape[:2] != source:
            raise MediaDecodeError(f"{encoded.origin}: frame {idx} is {rgb.shape[1]}x{rgb.shape[0]}, but earlier "
                                   f"sampled frames are {source[1]}x{source[0]} (size changes mid-stream)")
        small = resize_frame(rgb, out.shape[2:], backend).transpose(2, 0, 1)  # [3, h, w]
        del rgb
        for pos in positions[idx]:
            out[pos] = small
    if out is None:
        raise MediaDecodeError(f"{encoded.origin}: no frames decoded")
    return torch.from_numpy(out)  # [T, 3, h, w], contiguous: frames_to_rows reads it without a copy


def _check_area(origin: str, size: tuple[int, int], limits: MediaLimits) -> None:
    """Decoded frames larger than allowed (a header that lied, or decord, which we do not count frame by frame)."""
    if size[0] * size[1] > limits.max_image_pixels:
        raise MediaTooLargeError(f"{origin}: decoded frames are {size[1]}x{size[0]}, over the limit of "
                                 f"{limits.max_image_pixels} pixels")
