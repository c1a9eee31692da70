"""mm-infer: exact, fast multimodal (image + video) LLM inference for RL rollouts."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "LLM": "mm_infer.llm",
    "SamplingParams": "mm_infer.engine.sampling",
    "StructuredOutputsParams": "mm_infer.structured.params",
    "RequestOutput": "mm_infer.engine.outputs",
    "CompletionOutput": "mm_infer.engine.outputs",
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
