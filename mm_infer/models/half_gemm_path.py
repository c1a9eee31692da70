"""Which GEMM path half-type (bf16/fp16) weights take on this CPU: oneDNN with prepacked weights, torch's own
kernel, or float32 tiles.

torch's CPU half GEMM is fast where the CPU computes in that type (oneDNN's AMX / AVX512-BF16 / AVX512-FP16
kernels), faster still with the weight reordered once instead of per call (packed_weights.py), and slow where the
CPU has no half arithmetic: there it converts the weight once per output row, so a 16-row decode step
costs about 16 GEMVs, and float32 tiles through sgemm (half_linear.py) read the weight once. The choice is made per
dtype from the CPU's instruction sets, never from a timing at load: a timing is noisy, and a path picked by noise
would change a run's bits from one process to the next. `scripts/bench/half_linear.py` times both paths on the CPU
it runs on and prints the one chosen here. MM_INFER_HALF_GEMM=packed|torch|tiles forces one path for every half
dtype.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import torch

from mm_infer.models import packed_weights

GemmPath = Literal["packed", "torch", "tiles"]
PATHS: tuple[GemmPath, ...] = ("packed", "torch", "tiles")
ENV = "MM_INFER_HALF_GEMM"


@dataclass(frozen=True)
class CpuFeatures:
    """The instruction sets that decide the half GEMM path, and torch's own name for its kernel level."""

    model: str
    capability: str  # torch.backends.cpu.get_cpu_capability(): what ATen's vectorised kernels use
    avx512_bf16: bool
    amx_bf16: bool
    avx512_fp16: bool
    amx_fp16: bool

    def native(self, dtype: torch.dtype) -> bool:
        """Whether the CPU multiplies this half type in hardware (oneDNN then runs torch's GEMM natively)."""
        if dtype == torch.bfloat16:
            return self.avx512_bf16 or self.amx_bf16
        if dtype == torch.float16:
            return self.avx512_fp16 or self.amx_fp16
        return False


def _cpuinfo() -> tuple[str, set[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo; empty where the file is absent (macOS, Windows)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "", set()
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return fields.get("model name", ""), set(fields.get("flags", "").split())


@lru_cache(maxsize=1)
def cpu_features() -> CpuFeatures:
    """This CPU's features, from torch's probes where it has them and /proc/cpuinfo for the rest."""
    model, flags = _cpuinfo()
    probe = getattr(torch, "cpu", None)

    def has(name: str, flag: str) -> bool:
        fn = getattr(probe, name, None)
        return bool(fn()) if callable(fn) else flag in flags

    return CpuFeatures(model=model or "unknown", capability=torch.backends.cpu.get_cpu_capability(),
                       avx512_bf16=has("_is_avx512_bf16_supported", "avx512_bf16"),
                       amx_bf16="amx_bf16" in flags,
                       avx512_fp16="avx512_fp16" in flags, amx_fp16=has("_is_amx_fp16_supported", "amx_fp16"))


_forced: list[GemmPath | None] = [None]  # set by forced_path (tests, benchmarks); wins over the environment


@lru_cache(maxsize=1)
def _env_path() -> GemmPath | None:
    value = os.environ.get(ENV, "auto").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in PATHS:
        raise ValueError(f"{ENV}={value!r}: expected auto, packed, torch or tiles")
    return value  # type: ignore[return-value]


@lru_cache(maxsize=8)
def _auto_path(dtype: torch.dtype) -> GemmPath:
    if not cpu_features().native(dtype):
        return "tiles"
    return "packed" if packed_weights.available() else "torch"


def half_gemm_path(dtype: torch.dtype) -> GemmPath:
    """The path a CPU GEMM of >= 8 rows takes for this half dtype (fewer rows always take torch's GEMV)."""
    return _forced[0] or _env_path() or _auto_path(dtype)


@lru_cache(maxsize=8)
def mv_for_single_rows(dtype: torch.dtype) -> bool:
    """Whether one-row half GEMMs take torch.mv instead of F.linear: only bf16 on a CPU with native bf16, where mv
    reads the weight 1.25-1.6x faster at every 2B-model shape (fp16 there: 0.3-0.8x; AVX2 CPUs: not measured, so
    F.linear as before). The sums are float32 either way; bench_half_linear.py's rows-1 lines time both."""
    return dtype == torch.bfloat16 and cpu_features().native(dtype)


@contextmanager
def forced_path(path: GemmPath | None) -> Iterator[None]:
    """Every half dtype takes `path` inside the block (None: the automatic choice)."""
    if path is not None and path not in PATHS:
        raise ValueError(f"unknown half GEMM path {path!r}: expected one of {PATHS}")
    before, _forced[0] = _forced[0], path
    try:
        yield
    finally:
        _forced[0] = before


def describe() -> dict[str, str]:
    """What runs here, for logs, `mm-infer env` and bug reports: the CPU, torch's kernel level, each half path."""
    feats = cpu_features()
    isa = [name for name in ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16") if getattr(feats, name)]
    return {"cpu": feats.model, "cpu_capability": feats.capability, "cpu_half_isa": ",".join(isa) or "none",
            "half_gemm_bf16": half_gemm_path(torch.bfloat16), "half_gemm_fp16": half_gemm_path(torch.float16),
            "half_gemv_bf16": "mv" if mv_for_single_rows(torch.bfloat16) else "linear",
            "half_gemv_fp16": "mv" if mv_for_single_rows(torch.float16) else "linear"}
