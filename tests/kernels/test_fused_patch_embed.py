"""fused_patch_embed: Triton gather-matmul vs patchify + rows @ W.T, HF PatchEmbed oracle, assertions."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import BATCH_CASE, FRAME_CASES, frames_u8, packed_with_gaps

from mm_infer_kernels._frames import Normalize
from mm_infer_kernels.fused_patch_embed import (
    patch_embed_packed_reference,
    patch_embed_packed_triton,
    patch_embed_reference,
    patch_embed_triton,
    patch_embed_two_pass_triton,
)

# Max abs difference / max |reference| per weight dtype. Only the summation order over the 1176 features
# differs (fp32 accumulation in the kernel; cuBLAS on CUDA may reduce in lower precision), plus the output
# rounding in the weight dtype: about 2.5 bf16 ulps and 4 fp16 ulps at the largest output.
TOLERANCE = {torch.float32: 5e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}
HF_CONV3D_TOLERANCE = 2e-5  # fp32, vs HF's PatchEmbed (Conv3d; cuDNN picks its own algorithm on GPU)
DTYPES = list(TOLERANCE)
EMBED_DIMS = [16, 40, 72]  # 40, 72: not multiples of the N block


def weight(d: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(d, 3, 2, 14, 14, generator=g) * 0.02).to(dtype).to(device)  # Conv3d layout


def assert_close(out: torch.Tensor, ref: torch.Tensor, tol: float | None = None) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    rel = ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6)).item()
    assert rel <= (TOLERANCE[out.dtype] if tol is None else tol), f"{out.dtype}: relative max diff {rel}"


@pytest.mark.parametrize("thw", FRAME_CASES[:4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", EMBED_DIMS)
def test_single_item_matches_reference(thw: tuple[int, int, int], dtype: torch.dtype, d: int,
                                       device: torch.device) -> None:
    frames, w = frames_u8(*thw).to(device), weight(d, dtype, device)
    out = patch_embed_triton(frames, w)
    assert out.shape == (((thw[0] + 1) // 2) * (thw[1] // 14) * (thw[2] // 14), d)
    assert_close(out, patch_embed_reference(frames, w))


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_batch_matches_reference(dtype: torch.dtype, device: torch.device) -> None:
    items = [frames_u8(*thw, seed=i) for i, thw in enumerate(BATCH_CASE)]
    buf, offs, thw = packed_with_gaps(items)
    w = weight(40, dtype, device)
    out = patch_embed_packed_triton(buf.to(device), offs, thw, w)
    ref = patch_embed_packed_reference(buf.to(device), offs, thw, w)
    assert_close(out, ref)
    assert torch.equal(patch_embed_two_pass_triton(buf.to(device), offs, thw, w), ref)  # same rows, same matmul


@pytest.mark.parametrize("backend", ["torchvision", "pil"])
def test_pil_normalisation_and_channels_first(backend: str, device: torch.device) -> None:
    frames, w = frames_u8(3, 28, 56).to(device), weight(24, torch.bfloat16, device)
    norm = Normalize(backend=backend)
    ref = patch_embed_reference(frames, w, norm=norm)
    assert_close(patch_embed_triton(frames, w, norm=norm), ref)
    chw_view = frames.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)  # [T, H, W, 3] over [T, 3, H, W]
    assert_close(patch_embed_triton(chw_view, w, norm=norm), ref)


def test_matches_hf_patch_embed(device: torch.device) -> None:
    hf = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
    from mm_infer_kernels.fused_patchify import patchify_reference

    frames = frames_u8(3, 56, 28).to(device)
    conv = hf.PatchEmbed(patch_size=14, temporal_patch_size=2, in_channels=3, embed_dim=24).to(device)
    with torch.no_grad():
        ref = conv(patchify_reference(frames))  # HF: rows -> Conv3d
    assert_close(patch_embed_triton(frames, conv.proj.weight.detach()), ref, HF_CONV3D_TOLERANCE)


def test_accepts_2d_weight(device: torch.device) -> None:
    frames, w = frames_u8(1, 28, 28).to(device), weight(16, torch.float32, device)
    assert torch.equal(patch_embed_triton(frames, w), patch_embed_triton(frames, w.reshape(16, -1)))


def test_assertions(device: torch.device) -> None:
    frames, w = frames_u8(1, 28, 28).to(device), weight(16, torch.float32, device)
    with pytest.raises(AssertionError, match="weight must be"):
        patch_embed_triton(frames, w[:, :, :1])
    with pytest.raises(AssertionError, match="weight must be"):
        patch_embed_triton(frames, w.reshape(16, -1)[:, :1000])
    with pytest.raises(AssertionError, match="contiguous"):
        patch_embed_triton(frames, w.reshape(16, -1).t().contiguous().t())
    with pytest.raises(AssertionError, match="dtype"):
        patch_embed_triton(frames, w.double())
    with pytest.raises(AssertionError, match="uint8"):
        patch_embed_triton(frames.float(), w)
    with pytest.raises(AssertionError, match="multiples of 28"):
        patch_embed_triton(frames_u8(1, 14, 28).to(device), w)
