"""Triton import point for kernels/: interpreter default on CUDA-less hosts, shared jit helpers."""

from __future__ import annotations

import os

import torch

# Without CUDA, Triton can only run through its interpreter; @triton.jit reads this flag when a kernel
# is decorated, so it must be set before any kernel module is imported. A caller's own value wins.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


def interpreting() -> bool:
    """True when @triton.jit kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@triton.jit
def round_to_bf16_rne(x):
    """fp32 -> fp32 holding the round-to-nearest-even bf16 value (the interpreter's cast truncates)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + (((bits >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
    rounded = bits.to(tl.float32, bitcast=True)
    return tl.where(x != x, x, rounded)


@triton.jit
def cast_out(x, OUT_BF16: tl.constexpr, out_dtype: tl.constexpr):
    """fp32 -> the output element type with round-to-nearest-even, bit-equal to torch's .to()."""
    if OUT_BF16:
        x = round_to_bf16_rne(x)
    return x.to(out_dtype)


__all__ = ["triton", "tl", "interpreting", "round_to_bf16_rne", "cast_out"]
