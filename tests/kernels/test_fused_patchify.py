"""fused_patchify: Triton vs reference (bit-exact), HF golden parity, packed batches, launcher assertions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_cases import BATCH_CASE, FRAME_CASES, SHARED_GOLDEN, frames_u8, golden_frames, packed_with_gaps

from mm_infer_kernels._frames import QWEN2_VL, Normalize, PatchGeometry
from mm_infer_kernels.fused_patchify import (
    patchify_packed_reference,
    patchify_packed_triton,
    patchify_reference,
    patchify_triton,
)

# Max abs difference allowed against the reference, per output dtype. Every entry is exact: the kernel
# does the same single-rounding float32 ops (IEEE division) and round-to-nearest-even casts as torch.
TOLERANCE = {torch.float32: 0.0, torch.bfloat16: 0.0, torch.float16: 0.0}
DTYPES = list(TOLERANCE)


def assert_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    diff = (out.float().cpu() - ref.float().cpu()).abs().max().item() if out.numel() else 0.0
    assert diff <= TOLERANCE[out.dtype], f"{out.dtype}: max abs diff {diff}"


@pytest.mark.parametrize("thw", FRAME_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_single_item_matches_reference(thw: tuple[int, int, int], dtype: torch.dtype, device: torch.device) -> None:
    frames = frames_u8(*thw).to(device)
    out = patchify_triton(frames, out_dtype=dtype)
    t, h, w = thw
    assert out.shape == (((t + 1) // 2) * (h // 14) * (w // 14), 1176)
    assert_close(out, patchify_reference(frames, out_dtype=dtype))


def test_odd_t_repeats_last_frame(device: torch.device) -> None:
    frames = frames_u8(3, 28, 56).to(device)
    padded = torch.cat([frames, frames[-1:]]).contiguous()
    assert torch.equal(patchify_triton(frames), patchify_triton(padded))
    image = frames[:1].contiguous()
    assert torch.equal(patchify_triton(image), patchify_triton(torch.cat([image, image]).contiguous()))


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_batch_matches_reference(dtype: torch.dtype, device: torch.device) -> None:
    items = [frames_u8(*thw, seed=i) for i, thw in enumerate(BATCH_CASE)]
    buf, offs, thw = packed_with_gaps(items)
    buf = buf.to(device)
    out = patchify_packed_triton(buf, offs, thw, out_dtype=dtype)
    assert_close(out, patchify_packed_reference(buf, offs, thw, out_dtype=dtype))
    singles = torch.cat([patchify_triton(f.to(device), out_dtype=dtype) for f in items])
    assert torch.equal(out, singles)


def test_offsets_and_thw_as_tensors(device: torch.device) -> None:
    items = [frames_u8(1, 28, 28), frames_u8(2, 56, 28)]
    buf, offs, thw = packed_with_gaps(items, gap=3)
    out = patchify_packed_triton(buf.to(device), torch.tensor(offs), torch.tensor(thw))
    assert torch.equal(out, patchify_packed_triton(buf.to(device), offs, thw))


def test_other_geometry_and_norm(device: torch.device) -> None:
    geo = PatchGeometry(patch_size=16, temporal_patch_size=2, merge_size=2)  # Qwen3-VL-like patches
    frames = frames_u8(3, 32, 64).to(device)
    kw = dict(norm=Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)), geometry=geo)
    out = patchify_triton(frames, **kw)
    assert out.shape == (2 * 2 * 4, geo.width)
    assert_close(out, patchify_reference(frames, **kw))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", ["torchvision", "pil"])
def test_pil_normalisation_and_channels_first(dtype: torch.dtype, backend: str, device: torch.device) -> None:
    frames = frames_u8(3, 56, 28).to(device)
    norm = Normalize(backend=backend)
    ref = patchify_reference(frames, out_dtype=dtype, norm=norm)
    assert_close(patchify_triton(frames, out_dtype=dtype, norm=norm), ref)
    chw = frames.permute(0, 3, 1, 2).contiguous()  # [T, 3, H, W] as a resize produces it
    assert_close(patchify_triton(chw.permute(0, 2, 3, 1), out_dtype=dtype, norm=norm), ref)
    buf, offs, thw = packed_with_gaps([chw, chw[:1]])
    out = patchify_packed_triton(buf.to(device), offs, [[3, 56, 28], [1, 56, 28]], layout="tchw", norm=norm,
                                 out_dtype=dtype)
    assert_close(out, torch.cat([ref, patchify_reference(frames[:1], out_dtype=dtype, norm=norm)]))


@pytest.mark.skipif(not SHARED_GOLDEN.is_dir(), reason="shared golden outputs not present")
@pytest.mark.parametrize(("name", "kind", "backend"), [
    ("tiny_9x13.png", "image", "torchvision"), ("strip_wide.png", "image", "torchvision"),
    ("half_round_42x126.png", "image", "torchvision"), ("odd7_h264_2fps.mp4", "video", "torchvision"),
    ("tiny_9x13.png", "image", "pil"), ("half_round_42x126.png", "image", "pil")])
def test_matches_hf_golden_bit_for_bit(name: str, kind: str, backend: str, device: torch.device) -> None:
    frames, golden, grid = golden_frames(name, kind, backend)
    if kind == "image":
        frames = frames[:1].contiguous()  # T=1: the kernel pads it to 2 as HF does
    out = patchify_triton(frames.to(device), norm=Normalize(backend=backend)).cpu()
    assert list(QWEN2_VL.grid(frames.shape[:3])) == grid
    assert torch.equal(out, golden), f"max abs diff {(out - golden).abs().max().item()}"


def test_assertions(device: torch.device) -> None:
    frames = frames_u8(1, 28, 56).to(device)
    with pytest.raises(AssertionError, match="uint8"):
        patchify_triton(frames.float())
    with pytest.raises(AssertionError, match="contiguous"):
        patchify_triton(frames.transpose(1, 2))
    with pytest.raises(AssertionError, match="layout"):
        patchify_packed_triton(frames.view(-1), [0], [[1, 28, 56]], layout="nchw")
    with pytest.raises(AssertionError, match="backend"):
        patchify_triton(frames, norm=Normalize(backend="cv2"))
    with pytest.raises(AssertionError, match=r"\[T,H,W,3\]"):
        patchify_triton(frames[0])
    with pytest.raises(AssertionError, match="multiples of 28"):
        patchify_triton(frames_u8(1, 28, 42).to(device))
    with pytest.raises(AssertionError, match="out_dtype"):
        patchify_triton(frames, out_dtype=torch.int32)
    buf = frames.view(-1)
    with pytest.raises(AssertionError, match="overruns"):
        patchify_packed_triton(buf, [8], [[1, 28, 56]])
    with pytest.raises(AssertionError, match="offsets"):
        patchify_packed_triton(buf, [0, 0], [[1, 28, 28]])
    with pytest.raises(AssertionError, match="1-D"):
        patchify_packed_triton(frames, [0], [[1, 28, 56]])
    with pytest.raises(ValueError, match="positive"):
        patchify_packed_triton(buf, [0], [[0, 28, 56]])
    with pytest.raises(ValueError, match=r"\[n, 3\]"):
        patchify_packed_triton(buf, [0], torch.tensor([1, 28, 56]))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=3),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_random_batches_match_reference(sizes: list[tuple[int, int, int]], dtype: torch.dtype, seed: int,
                                        device: torch.device) -> None:
    items = [frames_u8(t, 28 * h, 28 * w, seed=seed + i) for i, (t, h, w) in enumerate(sizes)]
    buf, offs, thw = packed_with_gaps(items, gap=seed % 5)
    buf = buf.to(device)
    assert_close(patchify_packed_triton(buf, offs, thw, out_dtype=dtype),
                 patchify_packed_reference(buf, offs, thw, out_dtype=dtype))
