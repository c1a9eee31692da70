"""Structured outputs: the grammar a request's output must follow, compiled by xgrammar into per-step token masks."""

from mm_infer.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
