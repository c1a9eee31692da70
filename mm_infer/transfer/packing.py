"""The weight-transfer wire format: tensors in metadata order, packed into byte chunks (vLLM's packed broadcast)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from math import prod

import torch
from torch import Tensor

DEFAULT_BUFFER_BYTES = 1 << 30  # vLLM's DEFAULT_PACKED_BUFFER_SIZE_BYTES: both sides must use the same value
DEFAULT_NUM_BUFFERS = 2  # vLLM's DEFAULT_PACKED_NUM_BUFFERS (streams in flight; the bytes do not depend on it)


@dataclass(frozen=True)
class TensorMeta:
    """One tensor as announced in update_info: its HF name, dtype and full shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.dtype.itemsize


def dtype_named(name: str) -> torch.dtype:
    """torch.<name> for update_info's dtype_names ("bfloat16", "float32", ...); ValueError for anything else."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype name")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).split(".")[-1]


def chunk_plan(metas: Sequence[TensorMeta], buffer_bytes: int) -> list[list[int]]:
    """Indices of the tensors in each packed chunk. vLLM's rule, on both sides: a tensor joins the open chunk, and
    the chunk closes once its size exceeds buffer_bytes (so a chunk may hold one tensor bigger than the buffer)."""
    chunks: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, meta in enumerate(metas):
        current.append(i)
        size += meta.nbytes
        if size > buffer_bytes:
            chunks.append(current)
            current, size = [], 0
    if current:
        chunks.append(current)
    return chunks


def pack(tensors: Sequence[Tensor]) -> Tensor:
    """Tensors -> one uint8 tensor [sum of their bytes], each linearised in order (on the first tensor's device)."""
    return torch.cat([t.contiguous().view(-1).view(torch.uint8) for t in tensors])


def unpack(buffer: Tensor, metas: Sequence[TensorMeta]) -> list[tuple[str, Tensor]]:
    """uint8 buffer [sum of bytes] -> (name, tensor) views into it, by the announced dtypes and shapes."""
    parts = buffer.split([m.nbytes for m in metas])
    return [(m.name, _aligned(part, m.dtype.itemsize).view(m.dtype).view(m.shape))
            for m, part in zip(metas, parts, strict=True)]


def _aligned(part: Tensor, itemsize: int) -> Tensor:
    """A byte slice that can be viewed as `itemsize`-byte elements (copied when odd sizes before it shifted it)."""
    return part if part.storage_offset() % itemsize == 0 else part.clone()


def packed_chunks(named: Iterator[tuple[str, Tensor]], metas: Sequence[TensorMeta], buffer_bytes: int
                  ) -> Iterator[Tensor]:
    """The sender's side: one packed uint8 tensor per chunk of chunk_plan, checking each tensor against its meta."""
    for chunk in chunk_plan(metas, buffer_bytes):
        tensors = []
        for i in chunk:
            name, tensor = next(named)
            want = metas[i]
            if name != want.name or tensor.dtype != want.dtype or tuple(tensor.shape) != want.shape:
                raise ValueError(f"tensor {i} is {name!r} {tensor.dtype} {tuple(tensor.shape)} but update_info "
                                 f"announced {want.name!r} {want.dtype} {want.shape}")
            tensors.append(tensor.detach())
        yield pack(tensors)
