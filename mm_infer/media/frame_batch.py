"""FrameBatch: items' uint8 frames in one flat buffer (kernels' packed layout), what the device turns into rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels import dispatch as K
from kernels.geometry import Normalize, PatchGeometry


@dataclass(frozen=True)
class FrameBatch:
    """buffer [sum T*3*H*W] uint8, items stored [T, 3, H, W] ("tchw") at element `offsets`, (T, H, W) per item."""

    buffer: torch.Tensor
    offsets: tuple[int, ...]
    thw: tuple[tuple[int, int, int], ...]
    norm: Normalize
    geometry: PatchGeometry

    @staticmethod
    def pack(frames: Sequence[torch.Tensor], norm: Normalize, geometry: PatchGeometry) -> FrameBatch:
        """Items uint8 [T, 3, H, W] -> one batch (a single item is a view, no copy)."""
        flat = [f.contiguous().reshape(-1) for f in frames]  # each [T*3*H*W]
        offsets, start = [], 0
        for f in flat:
            offsets.append(start)
            start += f.numel()
        buffer = flat[0] if len(flat) == 1 else torch.cat(flat)
        thw = tuple((int(f.shape[0]), int(f.shape[2]), int(f.shape[3])) for f in frames)
        return FrameBatch(buffer, tuple(offsets), thw, norm, geometry)

    @property
    def grids(self) -> list[list[int]]:
        """Patch grids (t, h, w) per item, host ints."""
        return [list(self.geometry.grid(s)) for s in self.thw]

    @property
    def patches(self) -> int:
        return sum(t * h * w for t, h, w in self.grids)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> FrameBatch:
        """The same batch with its buffer on `device` (one uint8 host-to-device copy)."""
        return FrameBatch(self.buffer.to(device, non_blocking=non_blocking), self.offsets, self.thw, self.norm,
                          self.geometry)

    def rows(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Normalised pixel_values [patches, width] on the buffer's device (Triton on CUDA, torch elsewhere)."""
        return K.patchify_packed(self.buffer, list(self.offsets), [list(s) for s in self.thw], out_dtype=dtype,
                                 norm=self.norm, geometry=self.geometry, layout="tchw")

    def embed(self, weight: torch.Tensor) -> torch.Tensor:
        """Patch embeddings [patches, D] (weight [D, width], on the buffer's device): fused Triton on CUDA."""
        return K.patch_embed_packed(self.buffer, list(self.offsets), [list(s) for s in self.thw], weight,
                                    norm=self.norm, geometry=self.geometry, layout="tchw")
