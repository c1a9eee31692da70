"""smart_resize and the two bit-exact resize backends (torchvision-compatible and PIL)."""

from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image

from mm_infer.media.errors import MediaInvalidError

MAX_ASPECT_RATIO = 200


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 14 * 14 * 4 * 1280) -> tuple[int, int]:
    """Target (height, width): multiples of `factor`, area within [min_pixels, max_pixels], aspect kept.

    Same arithmetic as the Qwen2-VL reference, including Python's half-to-even `round`.
    """
    if height < 1 or width < 1:
        raise MediaInvalidError(f"image size {width}x{height} is empty")
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        raise MediaInvalidError(f"absolute aspect ratio must be at most {MAX_ASPECT_RATIO}, got {ratio:.1f} "
                                f"({width}x{height})")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def smart_resize_clip(num_frames: int, height: int, width: int, factor: int = 32, temporal_factor: int = 2,
                      min_pixels: int = 128 * 32 * 32, max_pixels: int = 32 * 32 * 768) -> tuple[int, int]:
    """Qwen3-VL's video smart_resize: one frame size for the clip, the pixel budget counting every frame.

    As transformers' Qwen3VLVideoProcessor: frames under `factor` are first scaled up; the area test uses
    the frame count rounded to `temporal_factor`, the rescale the count itself.
    """
    if num_frames < temporal_factor:
        raise MediaInvalidError(f"a video needs at least {temporal_factor} frames, got {num_frames}")
    if height < 1 or width < 1:
        raise MediaInvalidError(f"video frame size {width}x{height} is empty")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaInvalidError(f"absolute aspect ratio must be at most {MAX_ASPECT_RATIO} ({width}x{height})")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def resize_frames_torch(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 [T, 3, H, W] -> uint8 [T, 3, h, w] with torch's native uint8 antialiased bicubic.

    This is what the torchvision backend of the HF processors runs on CPU (no float round trip).
    """
    if tuple(frames.shape[-2:]) == tuple(size):
        return frames
    return torch.nn.functional.interpolate(frames, size=size, mode="bicubic", align_corners=False, antialias=True)


def resize_image_pil(image: Image.Image, size: tuple[int, int]) -> np.ndarray:
    """RGB PIL image -> uint8 [h, w, 3] with PIL bicubic, as the PIL backend of the HF processors."""
    height, width = size
    return np.asarray(image.resize((width, height), resample=Image.Resampling.BICUBIC))
