"""Shared constants for the parity tests: the repository root and the tiny checkpoints."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "assets" / "models" / "tiny-qwen2-vl"  # random weights
SHAPES = REPO / "assets" / "models" / "tiny-shapes-vl"  # trained: short answers ending in <|im_end|>
