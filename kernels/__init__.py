"""Triton-fused Qwen2-VL patching ops (one op per file) and the dispatcher that picks Triton or torch."""

from kernels.dispatch import (
    CLIP_MEAN,
    CLIP_STD,
    QWEN2_VL,
    Backend,
    PatchGeometry,
    grid_thw,
    pack_frames,
    patch_embed,
    patch_embed_packed,
    patch_merge,
    patchify,
    patchify_packed,
    select_backend,
    vision_position_ids,
    vision_rope,
    vision_rope_cos_sin,
    vision_rope_from_grid,
)

__all__ = ["CLIP_MEAN", "CLIP_STD", "QWEN2_VL", "Backend", "PatchGeometry", "grid_thw", "pack_frames",
           "patch_embed", "patch_embed_packed", "patch_merge", "patchify", "patchify_packed", "select_backend",
           "vision_position_ids", "vision_rope", "vision_rope_cos_sin", "vision_rope_from_grid"]
