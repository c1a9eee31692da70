"""patch_merge: raster -> merge-order gather vs reference, inverse, relation to patchify, assertions."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kernel_cases import frames_u8

from mm_infer_kernels._frames import Normalize
from mm_infer_kernels.fused_patchify import patchify_reference
from mm_infer_kernels.patch_merge import patch_merge_reference, patch_merge_triton

# Max abs difference against the reference per dtype: a pure row copy, so exact for every dtype.
TOLERANCE = {torch.float32: 0.0, torch.bfloat16: 0.0, torch.float16: 0.0, torch.int64: 0}
DTYPES = list(TOLERANCE)
GRIDS = [[[1, 2, 2]], [[3, 4, 6]], [[1, 2, 2], [2, 6, 4], [1, 2, 8], [1, 4, 2]]]
WIDTHS = [8, 300]  # 300: not a multiple of the column block


def rows(grid: list[list[int]], width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    s = sum(t * h * w for t, h, w in grid)
    if dtype == torch.int64:
        return torch.arange(s * width, device=device).view(s, width)
    return torch.randn(s, width, generator=torch.Generator().manual_seed(s)).to(dtype).to(device)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
def test_matches_reference_and_inverts(grid: list[list[int]], dtype: torch.dtype, width: int,
                                       device: torch.device) -> None:
    x = rows(grid, width, dtype, device)
    out = patch_merge_triton(x, grid)
    assert (out.float() - patch_merge_reference(x, grid).float()).abs().max().item() <= TOLERANCE[dtype]
    assert torch.equal(patch_merge_triton(out, grid, inverse=True), x)
    assert torch.equal(patch_merge_reference(patch_merge_reference(x, grid), grid, inverse=True), x)


def test_row_strided_input(device: torch.device) -> None:
    grid = [[2, 4, 6]]
    base = torch.randn(48, 64, device=device)
    x = base[:, 7:47]  # stride(0) = 64
    assert torch.equal(patch_merge_triton(x, grid), patch_merge_reference(x.contiguous(), grid))


def test_raster_patch_rows_become_qwen_rows(device: torch.device) -> None:
    frames = frames_u8(3, 56, 84).to(device)
    t, h, w = 2, 4, 6
    x = frames.permute(0, 3, 1, 2).float()  # [T, C, H, W] values 0..255
    x = torch.cat([x, x[-1:]]).reshape(t, 2, 3, h, 14, w, 14).permute(0, 3, 5, 2, 1, 4, 6)  # raster patches
    raster = x.reshape(t * h * w, 1176)
    unnormalised = patchify_reference(frames, norm=Normalize((0.0,) * 3, (1 / 255,) * 3))
    assert torch.equal(patch_merge_triton(raster, [[t, h, w]]), unnormalised)
    merged = patch_merge_triton(raster, [[t, h, w]])
    assert merged.view(-1, 4 * 1176).shape == (t * h * w // 4, 4704)  # the merger's free view


def test_assertions(device: torch.device) -> None:
    x = torch.randn(16, 8, device=device)
    with pytest.raises(AssertionError, match="rows"):
        patch_merge_triton(x, [[1, 2, 2]])
    with pytest.raises(AssertionError, match="merge"):
        patch_merge_triton(torch.randn(6, 8, device=device), [[1, 2, 3]])
    with pytest.raises(AssertionError, match="unit stride"):
        patch_merge_triton(x.t(), [[2, 2, 2]])
    with pytest.raises(AssertionError, match=r"\[S, D\]"):
        patch_merge_triton(x.view(16, 2, 4), [[1, 4, 4]])


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(grid=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=4),
       width=st.integers(1, 300), inverse=st.booleans())
def test_random_grids_match_reference(grid: list[tuple[int, int, int]], width: int, inverse: bool,
                                      device: torch.device) -> None:
    grid = [[t, 2 * h, 2 * w] for t, h, w in grid]
    x = rows(grid, width, torch.float32, device)
    assert torch.equal(patch_merge_triton(x, grid, inverse=inverse), patch_merge_reference(x, grid, inverse=inverse))
