"""PackedTensor: processed media items, as resized uint8 frames (pixel_values rows on demand) or as rows, with grids."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mm_infer.media.frame_batch import FrameBatch
from mm_infer.media.patchify import BACKENDS, DEFAULT_SPEC, PatchSpec, items_rows


class PackedTensor:
    """Media items packed for the vision encoder, in one of two forms.

    frames form (what the processor makes): `frames`, one uint8 [T, 3, H, W] contiguous tensor per item, resized,
    plus the `backend` and `spec` that turn them into rows; `pixel_values` is computed on demand, bit for bit.
    rows form (`PackedTensor(pixel_values, imgs_sizes, num_frames, hashes)`): the rows themselves.

    pixel_values: [sum(t*h*w), C*temporal_patch*patch*patch] rows in Qwen2-VL order.
    imgs_sizes:   [N, 3] int64 grid (t, h, w) per item, in patch units.
    num_frames:   [N] int64 decoded frames per item before temporal padding (1 for images).
    content_hashes: one hex digest per item (source bytes + processing options), for caches.
    """

    def __init__(self, pixel_values: torch.Tensor | None, imgs_sizes: torch.Tensor, num_frames: torch.Tensor,
                 content_hashes: list[str] | None = None, *, frames: Sequence[torch.Tensor] | None = None,
                 backend: str = "torchvision", spec: PatchSpec = DEFAULT_SPEC) -> None:
        if (pixel_values is None) == (frames is None):
            raise ValueError("a PackedTensor holds either pixel_values rows or uint8 frames")
        self._rows = pixel_values
        self.frames = None if frames is None else tuple(frames)
        self.imgs_sizes, self.num_frames = imgs_sizes, num_frames
        self.content_hashes = list(content_hashes or [])
        self.backend, self.spec = backend, spec
        self._check()

    @staticmethod
    def from_frames(frames: Sequence[torch.Tensor], content_hashes: list[str] | None = None, *,
                    backend: str = "torchvision", spec: PatchSpec = DEFAULT_SPEC) -> PackedTensor:
        """Items' uint8 [T, 3, H, W] frames -> a frames-form PackedTensor (grids and frame counts derived)."""
        frames = [f.contiguous() for f in frames]
        grids = [spec.geometry.grid((f.shape[0], f.shape[2], f.shape[3])) for f in frames]
        return PackedTensor(None, torch.tensor(grids, dtype=torch.long).reshape(-1, 3),
                            torch.tensor([f.shape[0] for f in frames], dtype=torch.long), content_hashes,
                            frames=frames, backend=backend, spec=spec)

    def _check(self) -> None:
        if self.imgs_sizes.ndim != 2 or self.imgs_sizes.shape[1] != 3:
            raise ValueError(f"imgs_sizes must be [N, 3], got {tuple(self.imgs_sizes.shape)}")
        n = self.imgs_sizes.shape[0]
        if self.num_frames.shape != (n,):
            raise ValueError(f"num_frames must be [{n}], got {tuple(self.num_frames.shape)}")
        if self.content_hashes and len(self.content_hashes) != n:
            raise ValueError(f"{len(self.content_hashes)} content hashes for {n} items")
        if self.frames is None:
            rows = int(self.imgs_sizes.prod(dim=1).sum()) if n else 0
            if self._rows.shape[0] != rows:
                raise ValueError(f"pixel_values has {self._rows.shape[0]} rows, grids need {rows}")
            return
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend '{self.backend}', expected one of {BACKENDS}")
        if len(self.frames) != n:
            raise ValueError(f"{len(self.frames)} frame tensors for {n} items")
        for f, grid in zip(self.frames, self.imgs_sizes.tolist(), strict=True):
            if f.dtype != torch.uint8 or f.ndim != 4 or f.shape[1] != 3 or not f.is_contiguous():
                raise ValueError(f"frames must be contiguous uint8 [T, 3, H, W], got {f.dtype} {tuple(f.shape)}")
            if list(self.spec.geometry.grid((f.shape[0], f.shape[2], f.shape[3]))) != grid:
                raise ValueError(f"frames {tuple(f.shape)} do not make the grid {grid}")

    def __len__(self) -> int:
        return int(self.imgs_sizes.shape[0])

    @property
    def has_frames(self) -> bool:
        return self.frames is not None

    @property
    def pixel_values(self) -> torch.Tensor:
        """[sum(t*h*w), width] float32 rows: stored (rows form) or computed now from the frames, bit for bit."""
        if self.frames is None:
            return self._rows
        if not self.frames:
            return torch.empty(0, self.spec.row_width, dtype=torch.float32)
        if self.frames[0].device.type != "cpu":
            return self.frame_batch().rows()
        return items_rows(self.frames, self.spec.normalizer(self.backend), self.spec.geometry)  # [rows, width]

    @property
    def nbytes(self) -> int:
        """Bytes this PackedTensor holds for its media (uint8 frames, or the rows)."""
        if self.frames is None:
            return int(self._rows.nbytes)
        return sum(int(f.nbytes) for f in self.frames)

    def frame_batch(self) -> FrameBatch:
        """The frames as one flat uint8 buffer with offsets and sizes, for the kernels (frames form only)."""
        if self.frames is None:
            raise ValueError("a rows-form PackedTensor has no frames")
        return FrameBatch.pack(self.frames, self.spec.normalizer(self.backend), self.spec.geometry)

    @staticmethod
    def joint_frame_batch(items: Sequence[PackedTensor]) -> FrameBatch | None:
        """All items' frames as one FrameBatch, or None unless every item holds frames of one backend and spec.

        Builds no tensor but the buffer (no host reads): safe on the engine's device path."""
        first = items[0] if items else None
        if first is None or any(it.frames is None or (it.backend, it.spec) != (first.backend, first.spec)
                                for it in items):
            return None
        return FrameBatch.pack([f for it in items for f in it.frames], first.spec.normalizer(first.backend),
                               first.spec.geometry)

    @property
    def patches_per_item(self) -> list[int]:
        return [int(x) for x in self.imgs_sizes.prod(dim=1).tolist()]

    def tokens_per_item(self, merge_size: int = 2) -> list[int]:
        """LLM tokens each item expands to: t*h*w / merge²."""
        return [p // (merge_size * merge_size) for p in self.patches_per_item]

    def _like(self, rows: torch.Tensor | None, frames: Sequence[torch.Tensor] | None, sizes: torch.Tensor,
              num_frames: torch.Tensor, hashes: list[str]) -> PackedTensor:
        return PackedTensor(rows, sizes, num_frames, hashes, frames=frames, backend=self.backend, spec=self.spec)

    def with_hashes(self, hashes: list[str], num_frames: torch.Tensor | None = None) -> PackedTensor:
        """The same media (no copy) with these content hashes (and frame counts, if given)."""
        nf = self.num_frames if num_frames is None else num_frames
        return self._like(self._rows, self.frames, self.imgs_sizes, nf, list(hashes))

    def split(self) -> list[PackedTensor]:
        """One PackedTensor per item (views, no copy)."""
        hashes = self.content_hashes or [""] * len(self)
        rows = torch.split(self._rows, self.patches_per_item) if self.frames is None else [None] * len(self)
        return [self._like(rows[i], None if self.frames is None else self.frames[i:i + 1], self.imgs_sizes[i:i + 1],
                           self.num_frames[i:i + 1], [hashes[i]] if self.content_hashes else [])
                for i in range(len(self))]

    @staticmethod
    def concat(items: Sequence[PackedTensor]) -> PackedTensor:
        """Concatenate items in order (frames stay frames when all share backend and spec); [] gives an empty one."""
        if not items:
            return PackedTensor.empty()
        if len(items) == 1:
            return items[0]  # nothing to join: no copy
        first = items[0]
        keep_hashes = all(it.content_hashes for it in items)
        hashes = [h for it in items for h in it.content_hashes] if keep_hashes else []
        sizes = torch.cat([it.imgs_sizes for it in items])
        num_frames = torch.cat([it.num_frames for it in items])
        if all(it.frames is not None and (it.backend, it.spec) == (first.backend, first.spec) for it in items):
            return first._like(None, [f for it in items for f in it.frames], sizes, num_frames, hashes)
        return PackedTensor(torch.cat([it.pixel_values for it in items]), sizes, num_frames, hashes)

    @staticmethod
    def empty(row_width: int = 1176, dtype: torch.dtype = torch.float32) -> PackedTensor:
        return PackedTensor(torch.empty(0, row_width, dtype=dtype), torch.empty(0, 3, dtype=torch.long),
                            torch.empty(0, dtype=torch.long), [])

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None,
           non_blocking: bool = False) -> PackedTensor:
        """On `device`: frames move as uint8; with a dtype, the rows in that dtype (rows form)."""
        sizes, nf, hashes = self.imgs_sizes.to(device), self.num_frames.to(device), list(self.content_hashes)
        if self.frames is not None and dtype is None:
            return self._like(None, [f.to(device, non_blocking=non_blocking) for f in self.frames], sizes, nf, hashes)
        pv = self.pixel_values
        return PackedTensor(pv.to(device=device, dtype=dtype or pv.dtype, non_blocking=non_blocking), sizes, nf, hashes)

    def pin_memory(self) -> PackedTensor:
        sizes, nf = self.imgs_sizes.pin_memory(), self.num_frames.pin_memory()
        if self.frames is not None:
            return self._like(None, [f.pin_memory() for f in self.frames], sizes, nf, list(self.content_hashes))
        return PackedTensor(self._rows.pin_memory(), sizes, nf, list(self.content_hashes))
