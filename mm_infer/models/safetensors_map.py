"""safetensors files as one private memory map each: every tensor is a view of its file's storage.

Views of one storage let the loader adopt byte-adjacent checkpoint tensors (gate_proj then up_proj) as one fused
parameter without a copy. The map is MAP_PRIVATE: pages are read on first use, and an in-place refit writes
private copies, never the file.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from mm_infer.models.errors import MissingTensorError

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


def read_header(path: Path) -> tuple[int, dict[str, dict]]:
    """(offset of the data section, {name: {dtype, shape, data_offsets}}) of one safetensors file."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise MissingTensorError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        length = struct.unpack("<Q", raw)[0]
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return 8 + length, header


def _view(base: Tensor, start: int, end: int, dtype: torch.dtype, shape: list[int]) -> Tensor:
    """The bytes [start, end) of base as a tensor; a copy only where the offset does not fit the dtype."""
    raw = base[start:end]
    if raw.numel() == 0:
        return torch.empty(shape, dtype=dtype)
    if start % dtype.itemsize:
        raw = raw.clone()  # misaligned for this dtype (writers order tensors so that this does not happen)
    return raw.view(dtype).view(shape)


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The *.safetensors files of a checkpoint folder, sorted; MissingTensorError when there are none."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise MissingTensorError(f"no *.safetensors files in {model_dir}")
    return files


def tensor_names(path: Path) -> list[str]:
    """The tensor names one safetensors file holds (its header only; no data is read)."""
    return list(read_header(path)[1])


def map_file(path: Path) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) of one file in storage order, each a view of the one private map of the file."""
    data_start, header = read_header(path)
    size = path.stat().st_size
    base = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)  # [bytes], MAP_PRIVATE
    for name, meta in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        if meta["dtype"] not in DTYPES:
            raise MissingTensorError(f"{path}: tensor {name!r} has dtype {meta['dtype']}, which this loader lacks")
        start, end = (data_start + offset for offset in meta["data_offsets"])
        if end > size:
            raise MissingTensorError(f"{path}: tensor {name!r} ends at byte {end}, past the file's {size}")
        yield name, _view(base, start, end, DTYPES[meta["dtype"]], meta["shape"])


def adjacent_span(parts: list[Tensor]) -> Tensor | None:
    """The parts [n_i, ...] as one tensor [sum n_i, ...] over their shared storage when they lie back to back
    in it (same dtype, contiguous, trailing shape equal); None otherwise."""
    first = parts[0]
    offset = first.storage_offset()
    for part in parts:
        if (part.dtype != first.dtype or part.device != first.device or not part.is_contiguous()
                or part.shape[1:] != first.shape[1:] or part.storage_offset() != offset
                or part.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()):
            return None
        offset += part.numel()
    shape = (sum(p.shape[0] for p in parts), *first.shape[1:])
    return first.as_strided(shape, torch.empty(shape, device="meta").stride())
