"""Prompt-side helpers: chat templating, placeholder expansion, M-RoPE positions."""
