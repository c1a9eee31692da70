"""Qwen2-VL / Qwen2.5-VL / Qwen3-VL (+MoE) model code: vision towers, M-RoPE LM over flat batches, loading."""

from mm_infer.models.attention import AttentionContext, DenseAttentionContext
from mm_infer.models.config import ModelConfig, TextConfig, VisionConfig, load_config, parse_config
from mm_infer.models.errors import (
    MissingTensorError,
    ModelLoadError,
    ShapeMismatchError,
    UnexpectedTensorError,
    UnknownArchitectureError,
    UnsupportedConfigError,
)
from mm_infer.models.loader import hf_to_internal, load_model, load_state_dict_into
from mm_infer.models.qwen_vl import QwenVLModel, scatter_embeddings

__all__ = [
    "AttentionContext",
    "DenseAttentionContext",
    "MissingTensorError",
    "ModelConfig",
    "ModelLoadError",
    "QwenVLModel",
    "ShapeMismatchError",
    "TextConfig",
    "UnexpectedTensorError",
    "UnknownArchitectureError",
    "UnsupportedConfigError",
    "VisionConfig",
    "hf_to_internal",
    "load_config",
    "load_model",
    "load_state_dict_into",
    "parse_config",
    "scatter_embeddings",
]
