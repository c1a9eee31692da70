"""R3's wire form: a sample's MoE routing as vLLM returns it, base64 of the array's `.npy` bytes."""

from __future__ import annotations

import base64
import io

import numpy as np


def encode_routed_experts(routing: np.ndarray | None) -> str | None:
    """[rows, layers, top_k] expert ids -> standard base64 of `np.save` bytes (no pickle); None stays None.
    A client reads it with `np.load(io.BytesIO(base64.b64decode(s)), allow_pickle=False)`."""
    if routing is None:
        return None
    with io.BytesIO() as buffer:
        np.save(buffer, np.ascontiguousarray(routing), allow_pickle=False)
        return base64.b64encode(buffer.getvalue()).decode("ascii")
