"""vision_rope: position ids and cos/sin vs HF, Triton and the CPU path vs reference (bit-exact), strided q/k."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mm_infer_kernels.vision_rope import (
    vision_position_ids,
    vision_rope_cos_sin,
    vision_rope_reference,
    vision_rope_torch,
    vision_rope_triton,
)

# Max abs difference against the reference per q/k dtype: exact, since the kernel does the same fp32
# multiplies and adds without FMA contraction and rounds to the input dtype to nearest even.
TOLERANCE = {torch.float32: 0.0, torch.bfloat16: 0.0, torch.float16: 0.0}
DTYPES = list(TOLERANCE)
GRIDS = [[[1, 2, 2]], [[3, 4, 6]], [[1, 2, 2], [2, 6, 4], [1, 2, 8]]]  # 1x1 merge grid, video, mixed batch
HEAD_DIMS = [16, 80, 12]  # 80: Qwen2-VL (half = 40, not a power of two); 12: half = 6


def grid_tokens(grid: list[list[int]]) -> int:
    return sum(t * h * w for t, h, w in grid)


def test_position_ids_match_hf() -> None:
    vu = pytest.importorskip("transformers.vision_utils")
    grid = torch.tensor([[1, 2, 2], [3, 4, 6], [2, 6, 2]])
    assert torch.equal(vision_position_ids(grid), vu.get_vision_position_ids(grid, 2))


@pytest.mark.parametrize("head_dim", [16, 80])
def test_cos_sin_match_hf(head_dim: int) -> None:
    hf = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
    from transformers import Qwen2VLVisionConfig

    grid = torch.tensor([[1, 4, 2], [2, 2, 6]])
    cfg = Qwen2VLVisionConfig(embed_dim=head_dim * 2, num_heads=2)
    rope = hf.Qwen2VLVisionRotaryEmbedding(cfg)
    cos_hf, sin_hf = rope(torch.zeros(1), vision_position_ids(grid))
    cos, sin = vision_rope_cos_sin(grid, head_dim, theta=cfg.rope_parameters["rope_theta"])
    assert torch.equal(cos, cos_hf) and torch.equal(sin, sin_hf)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_matches_reference(grid: list[list[int]], dtype: torch.dtype, head_dim: int, device: torch.device) -> None:
    cos, sin = vision_rope_cos_sin(grid, head_dim, device=device)
    g = torch.Generator().manual_seed(head_dim)
    q, k = torch.randn(2, grid_tokens(grid), 3, head_dim, generator=g).to(dtype).to(device)
    out, ref = vision_rope_triton(q, k, cos, sin), vision_rope_reference(q, k, cos, sin)
    for o, r in zip(out, ref, strict=True):
        assert o.dtype == dtype and o.shape == r.shape
        assert (o.float() - r.float()).abs().max().item() <= TOLERANCE[dtype]


def test_matches_hf_apply_rotary(device: torch.device) -> None:
    hf = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
    grid = [[2, 4, 4]]
    cos, sin = vision_rope_cos_sin(grid, 80, device=device)
    q, k = torch.randn(2, 32, 16, 80, dtype=torch.bfloat16, device=device)
    for o, r in zip(vision_rope_triton(q, k, cos, sin), hf.apply_rotary_pos_emb_vision(q, k, cos, sin), strict=True):
        assert torch.equal(o, r)


def test_strided_qkv_views(device: torch.device) -> None:
    grid = [[1, 4, 6]]
    cos, sin = vision_rope_cos_sin(grid, 16, device=device)
    qkv = torch.randn(grid_tokens(grid), 3, 4, 16, device=device)  # [S, 3, H, Dh] as a fused qkv proj
    q, k, _ = qkv.unbind(1)
    assert not q.is_contiguous()
    out = vision_rope_triton(q, k, cos, sin)
    ref = vision_rope_reference(q.contiguous(), k.contiguous(), cos, sin)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert out[0].is_contiguous()


def test_assertions(device: torch.device) -> None:
    cos, sin = vision_rope_cos_sin([[1, 2, 2]], 16, device=device)
    q = torch.randn(4, 2, 16, device=device)
    with pytest.raises(AssertionError, match=r"\[S, H, Dh\]"):
        vision_rope_triton(q, q[:, :1], cos, sin)
    with pytest.raises(AssertionError, match="dtype"):
        vision_rope_triton(q, q.half(), cos, sin)
    with pytest.raises(AssertionError, match="unit stride"):
        wide = torch.randn(4, 2, 32, device=device)[..., ::2]
        vision_rope_triton(wide, wide, cos, sin)
    with pytest.raises(AssertionError, match="cos must be"):
        vision_rope_triton(q, q, cos[:3], sin)
    with pytest.raises(AssertionError, match="float32"):
        vision_rope_triton(q, q, cos, sin.half())
    with pytest.raises(AssertionError, match="even"):
        odd = torch.randn(4, 2, 15, device=device)
        vision_rope_triton(odd, odd, cos[:, :15], sin[:, :15])


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(grid=st.lists(st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 3)), min_size=1, max_size=3),
       heads=st.integers(1, 5), quarter=st.integers(1, 12), dtype=st.sampled_from(DTYPES))
def test_random_shapes_match_reference(grid: list[tuple[int, int, int]], heads: int, quarter: int,
                                       dtype: torch.dtype, device: torch.device) -> None:
    grid = [[t, 2 * h, 2 * w] for t, h, w in grid]
    cos, sin = vision_rope_cos_sin(grid, 4 * quarter, device=device)
    q, k = torch.randn(2, grid_tokens(grid), heads, 4 * quarter).to(dtype).to(device)
    for o, r in zip(vision_rope_triton(q, k, cos, sin), vision_rope_reference(q, k, cos, sin), strict=True):
        assert (o.float() - r.float()).abs().max().item() <= TOLERANCE[dtype]


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_cpu_path_equals_reference_and_hf(grid: list[list[int]], dtype: torch.dtype, head_dim: int) -> None:
    """The in-place torch path the CPU runs: the reference's bits (and HF's), on strided views of a fused qkv.
    An FMA, a changed order of the two products, or a sign slip on either half would show."""
    cos, sin = vision_rope_cos_sin(grid, head_dim)
    g = torch.Generator().manual_seed(head_dim + 1)
    qkv = (torch.randn(grid_tokens(grid), 3, 3, head_dim, generator=g) * 30).to(dtype)  # large: products round
    q, k, _ = qkv.unbind(1)
    ref = vision_rope_reference(q, k, cos, sin)
    out = vision_rope_torch(q, k, cos, sin)
    assert all(torch.equal(o, r) and o.dtype == dtype for o, r in zip(out, ref, strict=True))
    hf = pytest.importorskip("transformers.models.qwen2_vl.modeling_qwen2_vl")
    assert all(torch.equal(o, r) for o, r in zip(out, hf.apply_rotary_pos_emb_vision(q, k, cos, sin), strict=True))
