"""Prompt-side helpers: chat templating, placeholder expansion, M-RoPE positions."""

from mm_infer.prompt.retokenize import replace_prefix_tokens

__all__ = ["replace_prefix_tokens"]
