"""Triton-fused Qwen2-VL patching ops (one op per file) and the dispatcher that picks Triton or torch."""
