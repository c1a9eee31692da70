"""Shared constants for the parity tests: the repository root and the tiny checkpoint."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "assets" / "models" / "tiny-qwen2-vl"
