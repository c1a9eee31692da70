"""Nemotron Omni images: HF 5.24's NemotronH_Omni_Reasoning_V3ImageProcessor grid, float resize and patch rows."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from mm_infer.media.errors import MediaInvalidError
from mm_infer_kernels.geometry import CLIP_MEAN, CLIP_STD, RESCALE, Normalize

OMNI_IMAGE_PROCESSOR = "NemotronH_Omni_Reasoning_V3ImageProcessor"


@dataclass(frozen=True)
class OmniImageSpec:
    """preprocessor_config.json of a Nemotron Omni checkpoint (HF's class defaults where a key is absent)."""

    patch_size: int = 16
    merge_size: int = 2  # round(1 / downsample_ratio)
    min_num_patches: int = 1024
    max_num_patches: int = 13312  # 0: no cap
    max_model_len: int = 16384
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    rescale_factor: float = RESCALE

    @staticmethod
    def from_config(cfg: Mapping[str, Any]) -> OmniImageSpec:
        """The legacy `norm_mean` / `norm_std` stand in for image_mean / image_std, as HF's __init__ maps them."""
        d = OmniImageSpec()
        mean = cfg.get("image_mean", cfg.get("norm_mean", d.image_mean))
        std = cfg.get("image_std", cfg.get("norm_std", d.image_std))
        return OmniImageSpec(int(cfg.get("patch_size", d.patch_size)),
                             round(1 / float(cfg.get("downsample_ratio", 1 / d.merge_size))),
                             int(cfg.get("min_num_patches", d.min_num_patches)),
                             int(cfg.get("max_num_patches", d.max_num_patches)),
                             int(cfg.get("max_model_len", d.max_model_len)), tuple(float(x) for x in mean),
                             tuple(float(x) for x in std), float(cfg.get("rescale_factor", d.rescale_factor)))

    @property
    def row_width(self) -> int:
        return 3 * self.patch_size**2

    def budget(self, n_images: int) -> int:
        """Patches any image of a call of `n_images` may use: the context (in pre-shuffle patches), clamped."""
        n = max((self.max_model_len - 4) * self.merge_size**2, self.min_num_patches * n_images)
        if self.max_num_patches:
            n = min(n, self.max_num_patches)
        return max(n, self.min_num_patches)


def _to_multiple(side: int, other: int, m: int, cap: int) -> int:
    """`side` up to a multiple of m if side*other still fits `cap`, else down (at least m)."""
    if rem := side % m:
        return side + m - rem if (side + m - rem) * other <= cap else max(m, side - rem)
    return side


def omni_patch_grid(height: int, width: int, spec: OmniImageSpec, budget: int) -> tuple[int, int]:
    """HF's get_patch_grid_size: (gh, gw) near the image's own grid, within the budget, multiples of merge.

    Python's `round` is half-to-even: a 512-pixel side (32.5) gives 32 patches, not 33."""
    if height < 1 or width < 1:
        raise MediaInvalidError(f"image size {width}x{height} is empty")
    p, lo = spec.patch_size, spec.min_num_patches
    gh, gw = round(height / p + 0.5), round(width / p + 0.5)
    f = min(math.sqrt(budget / (gh * gw)), 1.0)
    gh, gw = math.floor(f * gh), math.floor(f * gw)
    if gh < 1 or gw < 1:  # HF divides by zero next (an extreme aspect ratio)
        raise MediaInvalidError(f"image of {width}x{height} is too thin for a {budget}-patch budget")
    if budget > lo and gh * gw < lo:
        f = math.sqrt(lo / (gh * gw))
        gh, gw = math.ceil(f * gh), math.ceil(f * gw)
    gh = _to_multiple(gh, gw, spec.merge_size, budget)
    gw = _to_multiple(gw, gh, spec.merge_size, budget)
    return gh, gw


def patch_rows(images: torch.Tensor, patch: int) -> torch.Tensor:
    """float [C, H, W] -> [gh*gw, C*patch*patch]: row-major patches, each channel-major (C, py, px)."""
    c, h, w = images.shape
    x = images.reshape(c, h // patch, patch, w // patch, patch).permute(1, 3, 0, 2, 4)  # [gh, gw, C, p, p]
    return x.reshape((h // patch) * (w // patch), c * patch * patch)


def resize_float(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """float32 [N, C, H, W] -> [N, C, h, w], antialiased bicubic, unclamped; untouched when the size is equal."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return torch.nn.functional.interpolate(x, size=size, mode="bicubic", align_corners=False, antialias=True)


def omni_image_rows(image: torch.Tensor, spec: OmniImageSpec,
                    n_images: int = 1) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """uint8 [3, H, W] -> (float32 rows [gh*gw, 3*p*p], grid (1, gh, gw)), bit-exact with HF.

    The resize runs on float32 (the bicubic overshoot is kept), then HF's fused normalisation
    (x - mean/rescale) / (std/rescale) in float32, i.e. (x - 255*mean) / (255*std)."""
    _, height, width = image.shape
    gh, gw = omni_patch_grid(height, width, spec, spec.budget(n_images))
    p = spec.patch_size
    x = resize_float(image[None].to(torch.float32), (gh * p, gw * p))[0]  # [3, gh*p, gw*p]
    table = Normalize(spec.image_mean, spec.image_std, "torchvision", spec.rescale_factor).table(x.device)  # [2, 3]
    x = (x - table[0].view(3, 1, 1)) / table[1].view(3, 1, 1)
    return patch_rows(x, p), (1, gh, gw)
