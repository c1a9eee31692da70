"""mm-infer: exact, fast multimodal (image + video) LLM inference for RL rollouts."""

from __future__ import annotations

import os
from typing import Any

# MKL's strict reproducible mode: sgemm results that do not depend on the thread count (on AVX-512 CPUs MKL otherwise
# splits a dot product between threads from some shapes on, and heavy steps, step_threads.py, would change a
# request's numbers). Read at MKL's first call, so it must be set before any GEMM; a user's own value is kept.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.1.0"

_LAZY = {
    "LLM": "mm_infer.llm",
    "SamplingParams": "mm_infer.engine.sampling.params",
    "StructuredOutputsParams": "mm_infer.structured.params",
    "RequestOutput": "mm_infer.engine.outputs.request_output",
    "CompletionOutput": "mm_infer.engine.outputs.request_output",
    "LLMEngine": "mm_infer.engine.engine",
    "AsyncEngine": "mm_infer.engine.async_engine",
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    """Import the public API on first use so that `import mm_infer` stays cheap."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mm_infer' has no attribute {name!r}")
