"""Qwen2-VL vision ops, one per module (Triton kernel + launcher + torch reference); importing needs no triton."""
