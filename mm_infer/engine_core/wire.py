"""The bytes between the server process and the engine core: pickle 5, tensors inline or in /dev/shm files."""

from __future__ import annotations

import io
import itertools
import os
import pickle
import tempfile
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from mm_infer.distributed.errors import portable_error as portable_error  # the core's pipe and replicas share it
from mm_infer.engine.outputs.request_output import CompletionOutput, RequestMetrics, RequestOutput

SHM_MIN_BYTES = 64 << 10  # tensors at least this big (media frames, refit buckets) travel as shared-memory files
_SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
_names = itertools.count()


def _tensor_from_bytes(data: bytes, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    kind = getattr(torch, dtype)
    if not data:
        return torch.empty(shape, dtype=kind)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(kind).reshape(shape)


def _tensor_from_file(path: str, dtype: str, shape: tuple[int, ...], nbytes: int) -> torch.Tensor:
    """Read a tensor the other side wrote (one copy, into this process's memory), then remove its file."""
    raw = torch.from_file(path, shared=False, size=nbytes, dtype=torch.uint8)
    os.unlink(path)
    return raw.view(getattr(torch, dtype)).reshape(shape)


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """[n] uint8 view of a contiguous CPU copy of t (any dtype, any rank)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


class _Pickler(pickle.Pickler):
    """Pickles CPU tensors by value: small ones inline, big ones as a file in shared memory (named in `files`)."""

    def __init__(self, buffer: io.BytesIO, files: list[str]) -> None:
        super().__init__(buffer, protocol=5)
        self.files = files

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, torch.Tensor):
            return NotImplemented
        if obj.device.type != "cpu":
            raise TypeError(f"only CPU tensors cross to the engine core; got one on {obj.device}")
        dtype = str(obj.dtype).removeprefix("torch.")
        shape = tuple(obj.shape)
        flat = _flat_bytes(obj)
        if flat.numel() < SHM_MIN_BYTES:
            return _tensor_from_bytes, (flat.numpy().tobytes(), dtype, shape)
        path = str(_SHM_DIR / f"mm-infer-core-{os.getpid()}-{next(_names)}")
        out = torch.from_file(path, shared=True, size=flat.numel(), dtype=torch.uint8)
        out.copy_(flat)
        del out  # unmapped; the file stays until the reader takes it
        self.files.append(path)
        return _tensor_from_file, (path, dtype, shape, flat.numel())


def dumps(message: Any, tensors: bool = True) -> tuple[bytes, list[str]]:
    """The message's bytes and the shared-memory files it names (remove them if it is never read). Without
    `tensors` (outputs, gauges) it is plain pickle 5, with no per-object hook."""
    if not tensors:
        return pickle.dumps(message, protocol=5), []
    buffer = io.BytesIO()
    files: list[str] = []
    _Pickler(buffer, files).dump(message)
    return buffer.getvalue(), files


def loads(data: bytes) -> Any:
    return pickle.loads(data)


def remove_files(files: list[str]) -> None:
    """Drop shared-memory files a reader did not take (it died, or the request ended first)."""
    for path in files:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


_COMPLETION_FIELDS = tuple(f.name for f in fields(CompletionOutput))


def pack_output(out: RequestOutput, prompt_sent: bool) -> tuple:
    """The output as plain tuples, without what the server already holds (its prompt ids and text, and its prompt
    logprobs once sent). Pickling tuples of builtins is ~5x cheaper than the dataclasses, and the core is the
    process that pays: ~0.2 ms a step at 32 outputs before."""
    m = out.metrics
    prompt_lps = (None, None, None) if prompt_sent else (out.prompt_logprobs, out.prompt_top_logprobs,
                                                          out.prompt_ranks)
    samples = [tuple(getattr(c, name) for name in _COMPLETION_FIELDS) for c in out.outputs]
    return (out.request_id, out.finished, out.num_cached_tokens, out.error, out.extra or None, *prompt_lps,
            None if m is None else (m.arrival_time, m.first_token_time, m.finished_time), samples)


def unpack_output(packed: tuple) -> RequestOutput:
    """`pack_output`'s tuple -> the RequestOutput (prompt=None, no prompt ids: the server puts its own back)."""
    rid, finished, cached, error, extra, prompt_lps, prompt_tops, prompt_ranks, metrics, samples = packed
    return RequestOutput(rid, None, [], [CompletionOutput(*c) for c in samples], finished, prompt_lps, prompt_tops,
                         prompt_ranks, None if metrics is None else RequestMetrics(*metrics), cached, extra or {},
                         error)
