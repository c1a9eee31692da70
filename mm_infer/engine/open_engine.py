"""open_engine: the engine for a set of options: one process, or rank 0 of a tensor-parallel group."""

from __future__ import annotations

from typing import Any

from mm_infer.config import EngineConfig
from mm_infer.engine.engine import LLMEngine
from mm_infer.parallel.leader import LeaderEngine


def open_engine(model_dir: str, tokenizer: Any = None, **options: Any) -> LLMEngine:
    """LLMEngine for flat options (vLLM-style names); with tensor_parallel_size > 1, its LeaderEngine (rank 0,
    which starts the other ranks)."""
    config = EngineConfig.from_options(model_dir, **options)
    if config.tensor_parallel_size > 1:
        return LeaderEngine(config, tokenizer)
    return LLMEngine(config, tokenizer)
