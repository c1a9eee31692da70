"""Weight refits from disk: check a safetensors directory against a model, then read it in byte-bounded buckets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from math import prod
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from mm_infer.models.loader import loadable_tensors, stored_shape, tensor_fits, tensor_target

Bucket = list[tuple[str, Tensor]]


class WeightFileError(ValueError):
    """The directory cannot refit this model: no files, unknown tensor names, or wrong shapes."""


@dataclass(frozen=True)
class TensorEntry:
    name: str  # HF name as stored (either layout)
    file: Path
    nbytes: int


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The shard files named by model.safetensors.index.json, else every *.safetensors file (sorted)."""
    root = Path(model_dir)
    if not root.is_dir():
        raise WeightFileError(f"{model_dir} is not a directory")
    index = root / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [root / n for n in names]
    else:
        files = sorted(root.glob("*.safetensors"))
    if not files:
        raise WeightFileError(f"no *.safetensors files in {model_dir}")
    return files


def plan_refit(model_dir: str | Path, model: torch.nn.Module) -> list[TensorEntry]:
    """Every tensor to load, after checking names and shapes against `model` without reading any data."""
    params = loadable_tensors(model)
    tied = getattr(model, "lm_head", None) is None
    entries: list[TensorEntry] = []
    for path in safetensors_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                target = tensor_target(model)(key)
                if target is None or (target[0] == "lm_head.weight" and tied):
                    continue
                name, part = target
                if name not in params:
                    raise WeightFileError(f"{path.name}: tensor {key!r} maps to no parameter of this model")
                shape = tuple(f.get_slice(key).get_shape())
                want = stored_shape(model, params, name, part)
                if not tensor_fits(name, shape, want):
                    raise WeightFileError(f"{path.name}: tensor {key!r} has shape {shape}, the model wants {want}")
                entries.append(TensorEntry(key, path, prod(shape) * params[name].element_size()))
    if not entries:
        raise WeightFileError(f"{model_dir} holds no tensor of this model")
    return entries


def read_buckets(entries: list[TensorEntry], bucket_bytes: int) -> Iterator[Bucket]:
    """(name, tensor) lists of at most bucket_bytes each (one tensor may exceed it alone), read lazily."""
    bucket: Bucket = []
    size = 0
    handles: dict[Path, object] = {}
    for entry in entries:
        if bucket and size + entry.nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        if entry.file not in handles:
            handles[entry.file] = safe_open(str(entry.file), framework="pt")
        bucket.append((entry.name, handles[entry.file].get_tensor(entry.name)))  # type: ignore[attr-defined]
        size += entry.nbytes
    if bucket:
        yield bucket


def first_nonfinite(entries: list[TensorEntry], bucket_bytes: int) -> str | None:
    """The name of the first floating-point tensor holding NaN or inf (reads every tensor once, bucket by bucket)."""
    for bucket in read_buckets(entries, bucket_bytes):
        for name, tensor in bucket:
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                return name
    return None
