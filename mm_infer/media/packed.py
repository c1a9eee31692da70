"""PackedTensor: processed media items concatenated along the patch axis, with per-item grids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class PackedTensor:
    """Media items packed for the vision encoder.

    pixel_values: [sum(t*h*w), C*temporal_patch*patch*patch] rows in Qwen2-VL order.
    imgs_sizes:   [N, 3] int64 grid (t, h, w) per item, in patch units.
    num_frames:   [N] int64 decoded frames per item before temporal padding (1 for images).
    content_hashes: one hex digest per item (source bytes + processing options), for caches.
    """

    pixel_values: torch.Tensor
    imgs_sizes: torch.Tensor
    num_frames: torch.Tensor
    content_hashes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.imgs_sizes.ndim != 2 or self.imgs_sizes.shape[1] != 3:
            raise ValueError(f"imgs_sizes must be [N, 3], got {tuple(self.imgs_sizes.shape)}")
        n = self.imgs_sizes.shape[0]
        if self.num_frames.shape != (n,):
            raise ValueError(f"num_frames must be [{n}], got {tuple(self.num_frames.shape)}")
        rows = int(self.imgs_sizes.prod(dim=1).sum()) if n else 0
        if self.pixel_values.shape[0] != rows:
            raise ValueError(f"pixel_values has {self.pixel_values.shape[0]} rows, grids need {rows}")
        if self.content_hashes and len(self.content_hashes) != n:
            raise ValueError(f"{len(self.content_hashes)} content hashes for {n} items")

    def __len__(self) -> int:
        return int(self.imgs_sizes.shape[0])

    @property
    def patches_per_item(self) -> list[int]:
        return [int(x) for x in self.imgs_sizes.prod(dim=1).tolist()]

    def tokens_per_item(self, merge_size: int = 2) -> list[int]:
        """LLM tokens each item expands to: t*h*w / merge²."""
        return [p // (merge_size * merge_size) for p in self.patches_per_item]

    def split(self) -> list[PackedTensor]:
        """One PackedTensor per item (views, no copy)."""
        parts = torch.split(self.pixel_values, self.patches_per_item, dim=0)
        hashes = self.content_hashes or [""] * len(self)
        return [
            PackedTensor(p, self.imgs_sizes[i : i + 1], self.num_frames[i : i + 1],
                         [hashes[i]] if self.content_hashes else [])
            for i, p in enumerate(parts)
        ]

    @staticmethod
    def concat(items: Sequence[PackedTensor]) -> PackedTensor:
        """Concatenate items in order; an empty list gives an empty PackedTensor."""
        if not items:
            return PackedTensor.empty()
        if len(items) == 1:
            return items[0]  # nothing to join: no copy
        keep_hashes = all(it.content_hashes for it in items)
        return PackedTensor(
            torch.cat([it.pixel_values for it in items], dim=0),
            torch.cat([it.imgs_sizes for it in items], dim=0),
            torch.cat([it.num_frames for it in items], dim=0),
            [h for it in items for h in it.content_hashes] if keep_hashes else [],
        )

    @staticmethod
    def empty(row_width: int = 1176, dtype: torch.dtype = torch.float32) -> PackedTensor:
        return PackedTensor(torch.empty(0, row_width, dtype=dtype), torch.empty(0, 3, dtype=torch.long),
                            torch.empty(0, dtype=torch.long), [])

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None,
           non_blocking: bool = False) -> PackedTensor:
        pv = self.pixel_values.to(device=device, dtype=dtype or self.pixel_values.dtype,
                                  non_blocking=non_blocking)
        return PackedTensor(pv, self.imgs_sizes.to(device), self.num_frames.to(device),
                            list(self.content_hashes))

    def pin_memory(self) -> PackedTensor:
        return PackedTensor(self.pixel_values.pin_memory(), self.imgs_sizes.pin_memory(),
                            self.num_frames.pin_memory(), list(self.content_hashes))
