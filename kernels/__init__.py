"""Triton-fused Qwen2-VL patching ops, one op per module; call them through kernels.dispatch."""
