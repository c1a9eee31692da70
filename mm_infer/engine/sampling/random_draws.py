"""Counter-based uniform draws: u = hash(seed, step), batched on any device and identical on CPU and CUDA."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

_M32 = 0xFFFFFFFF
_STEP_KEY = 0x9E3779B9  # keeps step 0 of seed 0 away from the hash's fixed point at 0


def _mix32(x: Tensor | np.ndarray) -> Tensor | np.ndarray:
    """A 32-bit integer finaliser on int64 tensors (or arrays) holding values in [0, 2^32).

    Both multipliers are below 2^31, so every product stays below 2^63: no int64 overflow on any device.
    """
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & _M32
    return x ^ (x >> 15)


def seed_to_int64(seed: int) -> int:
    """Any Python int seed as the signed int64 with the same low 64 bits (2^64 - 1 and -1 are one seed)."""
    seed %= 1 << 64
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def _hash(seeds: Tensor | np.ndarray, steps: Tensor | np.ndarray) -> Tensor | np.ndarray:
    """[R] int64 hashes in [0, 2^32) of (seed, step); the same integer steps on torch tensors and numpy arrays."""
    lo, hi = seeds & _M32, (seeds >> 32) & _M32  # the arithmetic shift is masked back to 32 bits
    h = _mix32((steps & _M32) ^ _STEP_KEY)
    h = _mix32(h ^ hi)
    return _mix32(h ^ lo)


def uniforms(seeds: Tensor, steps: Tensor) -> Tensor:
    """seeds [R] int64, steps [R] int64 (>= 0) -> [R] float32 uniforms in [0, 1).

    Draw `step` of the stream `seed` depends on that pair alone: never on other rows, the batch, the device or
    what was drawn before, so a preempted and recomputed sequence redraws exactly the same tokens. On the CPU the
    fifteen integer steps run in numpy (exact integer maths: the same bits, without fifteen torch dispatches).
    """
    if seeds.device.type == "cpu" and steps.device.type == "cpu":
        h = _hash(seeds.numpy(), steps.numpy())
        return torch.from_numpy((h >> 8).astype(np.float32) * np.float32(1.0 / (1 << 24)))
    h = _hash(seeds, steps)
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))  # 24 bits: every value exact in float32
