"""Lazy Triton access for the kernels: triton and the @triton.jit modules load on the first launch, never on import.

Importing mm_infer_kernels/ (or mm_infer) imports no triton and leaves os.environ alone. @triton.jit reads
TRITON_INTERPRET when a kernel is decorated, and without CUDA Triton runs only in its interpreter; so
`load` is where the flag is set: the first launch on CPU tensors, on a host without CUDA, sets
TRITON_INTERPRET=1 just before the jit modules are imported. A value the caller set wins.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from types import ModuleType

import torch

ENV = "TRITON_INTERPRET"
_JIT_ROOT = "mm_infer_kernels._jit"  # imported by every jit module: present once any kernel has been decorated


def interpreting() -> bool:
    """True when @triton.jit kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get(ENV, "0").lower() in ("1", "true", "on", "yes")


@functools.cache
def available() -> bool:
    """True when triton can be imported (looked up, not imported)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def cpu_ready() -> bool:
    """Whether launchers can take CPU tensors: the interpreter is on, or the first launch will turn it on."""
    if interpreting():
        return True
    return ENV not in os.environ and not torch.cuda.is_available() and _JIT_ROOT not in sys.modules


def load(name: str, *tensors: torch.Tensor) -> ModuleType:
    """The private jit module mm_infer_kernels.<name>, imported on first use for a launch on `tensors`."""
    if not available():
        raise RuntimeError("the Triton kernels need triton installed; the torch references do not")
    if any(t.device.type == "cpu" for t in tensors) and not interpreting():
        if not cpu_ready():
            raise RuntimeError(f"Triton launchers on CPU tensors need {ENV}=1 set before the first Triton launch")
        os.environ[ENV] = "1"
    return importlib.import_module(f"{__package__}.{name}")


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive ints (triton.cdiv, without importing triton)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (triton.next_power_of_2, without importing triton)."""
    return 1 << max(0, n - 1).bit_length()
