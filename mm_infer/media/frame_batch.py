"""FrameBatch: items' uint8 frames in one flat buffer (kernels' packed layout), what the device turns into rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mm_infer.media.patchify import items_rows
from mm_infer_kernels import dispatch as K
from mm_infer_kernels.fused_patch_embed import patch_embed_rows, weight_matrix
from mm_infer_kernels.geometry import Normalize, PatchGeometry

# CPU GEMMs give row-invariant results from this many rows up: patch-embed chunks of at least this many rows give
# every row the bits of one matmul over the whole batch.
ROW_INVARIANT_ROWS = 16


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

    def item(self, i: int) -> torch.Tensor:
        """Item i's uint8 frames [T, 3, H, W], a view of the buffer."""
        t, h, w = self.thw[i]
        return self.buffer[self.offsets[i]:self.offsets[i] + t * 3 * h * w].view(t, 3, h, w)

    def row_chunks(self) -> list[list[int]]:
        """Consecutive items grouped so that each group has >= ROW_INVARIANT_ROWS patches (unless all together
        have fewer): one matmul per group then gives the bits of one matmul over the batch."""
        sizes = [t * h * w for t, h, w in self.grids]
        groups: list[list[int]] = []
        rows = 0
        for i, n in enumerate(sizes):
            if groups and rows < ROW_INVARIANT_ROWS:
                groups[-1].append(i)
                rows += n
            else:
                groups.append([i])
                rows = n
        if len(groups) > 1 and rows < ROW_INVARIANT_ROWS:  # a short tail joins the group before it
            tail = groups.pop()
            groups[-1] += tail
        return groups

    def embed(self, weight: torch.Tensor) -> torch.Tensor:
        """Patch embeddings [patches, D] (weight [D, width], on the buffer's device): fused Triton on CUDA.

        On the CPU's torch path each group of `row_chunks` makes its rows by table lookup and embeds them, so the
        rows of the whole batch never exist at once (4.7 MB an image at 1024x768; fresh pages cost ~1 ms/MB here).
        """
        if self.buffer.device.type == "cpu" and K.select_backend(self.buffer, weight) == "torch":
            w = weight_matrix(weight, self.geometry)  # [D, width]
            parts = [self._group_rows(group) for group in self.row_chunks()]
            out = [patch_embed_rows(rows, w) for rows in parts]  # each [rows, D]
            return out[0] if len(out) == 1 else torch.cat(out)
        return K.patch_embed_packed(self.buffer, list(self.offsets), [list(s) for s in self.thw], weight,
                                    norm=self.norm, geometry=self.geometry, layout="tchw")

    def _group_rows(self, group: list[int]) -> torch.Tensor:
        """float32 rows [patches, width] of consecutive items, by table lookup."""
        return items_rows([self.item(i) for i in group], self.norm, self.geometry)
