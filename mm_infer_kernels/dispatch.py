"""Public entry points for the kernels: Triton on CUDA tensors, torch reference elsewhere (MM_INFER_KERNELS forces).

MM_INFER_KERNELS=triton|torch|auto (default auto) is read on every call; auto also needs triton installed.
`triton` on CPU tensors runs the Triton interpreter (slow: for tests, not serving): the first Triton launch
on a host without CUDA sets TRITON_INTERPRET=1 before triton is imported (mm_infer_kernels/_triton.py). Importing
this module imports no triton and writes no environment variable.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

import torch

from mm_infer_kernels import _triton
from mm_infer_kernels import fused_patch_embed as _pe
from mm_infer_kernels import fused_patchify as _pf
from mm_infer_kernels import gated_delta_segments as _gd
from mm_infer_kernels import mamba_segments as _ms
from mm_infer_kernels import paged_decode as _pd
from mm_infer_kernels import paged_prefill as _pp
from mm_infer_kernels import patch_merge as _pm
from mm_infer_kernels import vision_rope as _vr
from mm_infer_kernels._frames import CLIP, QWEN2_VL, Layout, Normalize, Offsets, PatchGeometry, Sizes, single_item
from mm_infer_kernels._items import exclusive_cumsum, sizes_list
from mm_infer_kernels._triton import interpreting
from mm_infer_kernels.fused_patch_embed import patch_embed_rows  # rows @ W.T: torch (cuBLAS) on every device
from mm_infer_kernels.patch_merge import merge_units  # a reshape on every device
from mm_infer_kernels.vision_rope import vision_position_ids, vision_rope_cos_sin

Backend = Literal["triton", "torch"]
ENV = "MM_INFER_KERNELS"

__all__ = ["CLIP", "QWEN2_VL", "Normalize", "PatchGeometry", "Layout", "Backend", "select_backend", "pack_frames",
           "grid_thw", "patchify", "patchify_packed", "patch_embed", "patch_embed_packed", "vision_rope",
           "patch_embed_rows", "vision_rope_from_grid", "vision_rope_cos_sin", "vision_position_ids", "patch_merge",
           "merge_units", "interpreting", "paged_decode", "paged_prefill", "mamba_conv", "mamba_scan", "gated_delta",
           "Segments"]
Segments = _ms.Segments


def select_backend(*tensors: torch.Tensor) -> Backend:
    """The backend for an op on these tensors: the MM_INFER_KERNELS override, else triton iff all on CUDA."""
    forced = os.environ.get(ENV, "auto").strip().lower()
    if forced not in ("triton", "torch", "auto", ""):
        raise ValueError(f"{ENV} must be triton, torch or auto, got {forced!r}")
    if forced == "torch":
        return "torch"
    if forced == "triton":
        if not _triton.available():
            raise RuntimeError(f"{ENV}=triton needs triton installed")
        if any(t.device.type == "cpu" for t in tensors) and not _triton.cpu_ready():
            raise RuntimeError(f"{ENV}=triton on CPU tensors needs TRITON_INTERPRET=1 set before the first "
                               "Triton launch (on a host with CUDA, or after kernels compiled for it)")
        return "triton"
    on_cuda = bool(tensors) and all(t.is_cuda for t in tensors)
    return "triton" if on_cuda and _triton.available() else "torch"


def pack_frames(frames: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[int], list[list[int]]]:
    """Items [T, H, W, 3] uint8 -> (flat uint8 buffer [sum T*H*W*3], element offsets, (T, H, W) per item)."""
    assert len(frames) > 0, "no items to pack"
    for f in frames:
        assert f.dtype == torch.uint8 and f.ndim == 4 and f.shape[3] == 3, "items must be uint8 [T, H, W, 3]"
    thw = [list(f.shape[:3]) for f in frames]
    offsets = exclusive_cumsum([f.numel() for f in frames])
    return torch.cat([f.reshape(-1) for f in frames]), offsets, thw  # [N] uint8


def grid_thw(thw: Sizes, geometry: PatchGeometry = QWEN2_VL) -> torch.Tensor:
    """Frame sizes (T, H, W) per item -> patch grids [n, 3] int64 (t = ceil(T / tp), H / p, W / p)."""
    return torch.tensor([geometry.grid(s) for s in sizes_list(thw, 3, "thw")], dtype=torch.int64)


def patchify_packed(buffer: torch.Tensor, offsets: Offsets, thw: Sizes, *, out_dtype: torch.dtype = torch.float32,
                    norm: Normalize = CLIP, geometry: PatchGeometry = QWEN2_VL,
                    layout: Layout = "thwc") -> torch.Tensor:
    """Flat uint8 buffer of items -> normalised pixel_values [sum(t*h*w), width] in Qwen2-VL row order."""
    fn = _pf.patchify_packed_triton if select_backend(buffer) == "triton" else _pf.patchify_packed_reference
    return fn(buffer, offsets, thw, out_dtype=out_dtype, norm=norm, geometry=geometry, layout=layout)


def patchify(frames: torch.Tensor | Sequence[torch.Tensor], **kwargs) -> torch.Tensor:
    """One item [T, H, W, 3] uint8 (or [T, 3, H, W] permuted), or a list of items (packed with one copy)."""
    if isinstance(frames, torch.Tensor):
        buffer, offsets, thw, layout = single_item(frames)
        return patchify_packed(buffer, offsets, thw, layout=layout, **kwargs)
    return patchify_packed(*pack_frames(frames), **kwargs)


def patch_embed_packed(buffer: torch.Tensor, offsets: Offsets, thw: Sizes, weight: torch.Tensor, *,
                       norm: Normalize = CLIP, geometry: PatchGeometry = QWEN2_VL, layout: Layout = "thwc",
                       fused: bool = True) -> torch.Tensor:
    """Packed uint8 items + Conv3d weight [D, 3, tp, p, p] -> patch embeddings [sum(t*h*w), D], weight dtype.

    fused=True: one Triton gather-matmul (rows never written). fused=False: Triton patchify + torch matmul,
    bit-equal to the torch backend. Which is faster depends on the GPU: scripts/gpu/bench_kernels.py times both.
    """
    if select_backend(buffer, weight) == "torch":
        fn = _pe.patch_embed_packed_reference
    else:
        fn = _pe.patch_embed_packed_triton if fused else _pe.patch_embed_two_pass_triton
    return fn(buffer, offsets, thw, weight, norm=norm, geometry=geometry, layout=layout)


def patch_embed(frames: torch.Tensor | Sequence[torch.Tensor], weight: torch.Tensor, **kwargs) -> torch.Tensor:
    """One item [T, H, W, 3] uint8 (or [T, 3, H, W] permuted), or a list of items -> embeddings [rows, D]."""
    if isinstance(frames, torch.Tensor):
        buffer, offsets, thw, layout = single_item(frames)
        return patch_embed_packed(buffer, offsets, thw, weight, layout=layout, **kwargs)
    return patch_embed_packed(*pack_frames(frames), weight, **kwargs)


def vision_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [S, H, Dh] with cos, sin [S, Dh] float32 -> rotated (q, k), new tensors in the input dtype."""
    if select_backend(q, k, cos, sin) == "triton":
        return _vr.vision_rope_triton(q, k, cos, sin)
    _vr.check_rope_args(q, k, cos, sin)
    return _vr.vision_rope_torch(q, k, cos, sin)


def vision_rope_from_grid(q: torch.Tensor, k: torch.Tensor, grid_thw: torch.Tensor | list, *,
                          theta: float = 10000.0, merge_size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """vision_rope with cos/sin built from the items' grids (compute them once per forward when looping)."""
    cos, sin = vision_rope_cos_sin(grid_thw, q.shape[-1], theta=theta, merge_size=merge_size, device=q.device)
    return vision_rope(q, k, cos, sin)


def patch_merge(x: torch.Tensor, grid_thw: torch.Tensor | list, *, merge_size: int = 2,
                inverse: bool = False) -> torch.Tensor:
    """Raster-order rows [S, D] -> merge order [S, D] (or back); see patch_merge.py for when it is free."""
    if select_backend(x) == "triton":
        return _pm.patch_merge_triton(x, grid_thw, merge_size=merge_size, inverse=inverse)
    return _pm.patch_merge_reference(x, grid_thw, merge_size=merge_size, inverse=inverse)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                 lens: torch.Tensor, block_size: int) -> torch.Tensor:
    """Decode attention q [B, Hq, D] over each sequence's cache blocks (caches [Hkv, slots, D]) -> [B, Hq, D]."""
    if select_backend(q, k_cache, v_cache) == "triton":
        return _pd.paged_decode_triton(q, k_cache, v_cache, tables, lens, block_size)
    return _pd.paged_decode_sdpa(q, k_cache, v_cache, tables, lens, block_size)


def paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                  q_starts: torch.Tensor, q_lens: torch.Tensor, ctx_lens: torch.Tensor, block_size: int, max_q: int,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Prefill/extend attention: sequence b's q_lens[b] rows from q_starts[b] of q [N, Hq, D] over its ctx_lens[b]
    cached keys (causal within the chunk), caches [Hkv, slots, D]; writes those rows of out."""
    if select_backend(q, k_cache, v_cache) == "triton":
        return _pp.paged_prefill_triton(q, k_cache, v_cache, tables, q_starts, q_lens, ctx_lens, block_size, max_q,
                                        out)
    return _pp.paged_prefill_reference(q, k_cache, v_cache, tables, q_starts, q_lens, ctx_lens, block_size, out)


def mamba_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pool: torch.Tensor,
               seg: _ms.Segments) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal depthwise conv + SiLU of every segment's rows of x [N, C] from its pool slot -> (out [N, C], final
    conv states [S, C, K-1], states at the snapshot offsets)."""
    fn = _ms.conv_triton if select_backend(x, pool) == "triton" else _ms.conv_reference
    return fn(x, weight, bias, pool, seg)


def mamba_scan(x: torch.Tensor, dt: torch.Tensor, dt_bias: torch.Tensor, a_log: torch.Tensor, b: torch.Tensor,
               c: torch.Tensor, d: torch.Tensor, pool: torch.Tensor, seg: _ms.Segments,
               dt_min: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The SSD recurrence over every segment from its pool slot -> (y [N, H, P] float32, final states, snapshots)."""
    fn = _ms.scan_triton if select_backend(x, pool) == "triton" else _ms.scan_reference
    return fn(x, dt, dt_bias, a_log, b, c, d, pool, seg, dt_min)


def gated_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                pool: torch.Tensor, seg: _ms.Segments) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gated delta rule over every segment from its pool slot -> (o [N, H, DV] float32, final states,
    snapshots)."""
    fn = _gd.gated_delta_triton if select_backend(q, pool) == "triton" else _gd.gated_delta_reference
    return fn(q, k, v, g, beta, pool, seg)
