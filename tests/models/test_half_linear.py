"""Half-type linear layers on the CPU: float32 tiles give torch's half GEMM maths (float32 sums, one rounding)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mm_infer.models import half_linear
from mm_infer.models.half_gemm_path import forced_path
from mm_infer.models.half_linear import Linear, linear, upcast_linear


def _operands(dtype: torch.dtype, rows: int, k: int, n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    return x, w, b


def _float64_rounded(x, w, b):
    """The exact sum (float64 holds every half product and these sums), rounded once to the half type."""
    out = x.double() @ w.double().t() + (0 if b is None else b.double())
    return out.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_tiles_round_the_float32_sum_once(monkeypatch, dtype, with_bias):
    # small tiles: 37 output features over tiles of 8 rows leave a partial last tile
    monkeypatch.setattr(half_linear, "TILE_ELEMENTS", 8 * 24)
    x, w, b = _operands(dtype, rows=19, k=24, n=37)
    bias = b if with_bias else None
    ours = upcast_linear(x, w, bias)
    assert ours.dtype == dtype and ours.shape == (19, 37)
    exact = _float64_rounded(x, w, bias)
    # float32 sums of 24 terms round like the exact sum but for rare half-way cases: one ulp at most
    ulp = torch.finfo(dtype).eps * exact.float().abs().clamp_min(1e-3)
    assert ((ours.float() - exact.float()).abs() <= ulp).all()
    assert (ours == exact).float().mean() > 0.97
    torch.testing.assert_close(ours, F.linear(x, w, bias))


def test_every_tile_is_written(monkeypatch):
    """A missed or shifted tile leaves uninitialised or wrong columns; each column is checked."""
    monkeypatch.setattr(half_linear, "TILE_ELEMENTS", 8 * 16)
    x, w, _ = _operands(torch.bfloat16, rows=9, k=16, n=45, seed=3)
    ours = upcast_linear(x, w).float()
    ref = x.float() @ w.float().t()
    assert torch.allclose(ours, ref, rtol=1e-2, atol=1e-2), (ours - ref).abs().max(dim=0)


def test_leading_dimensions_kept():
    x, w, b = _operands(torch.bfloat16, rows=24, k=16, n=12)
    out = upcast_linear(x.view(2, 12, 16), w, b)
    assert out.shape == (2, 12, 12)
    assert torch.equal(out.view(24, 12), upcast_linear(x, w, b))


def test_rows_do_not_depend_on_the_batch():
    """batch_invariant pads every batch to 16 rows: a row alone (padded) equals the same row among 64."""
    x, w, b = _operands(torch.bfloat16, rows=64, k=96, n=200, seed=1)
    batch = upcast_linear(x, w, b)
    for i in (0, 17, 63):
        alone = torch.cat([x[i:i + 1], x.new_zeros(15, 96)])
        assert torch.equal(upcast_linear(alone, w, b)[0], batch[i]), f"row {i}"


@pytest.fixture
def tiles_forced():
    """The float32-tile path, whatever this CPU would choose (half_gemm_path.py)."""
    with forced_path("tiles"):
        yield


def test_dispatch(monkeypatch, tiles_forced):
    calls = []
    real = half_linear.upcast_linear
    monkeypatch.setattr(half_linear, "upcast_linear", lambda *a: calls.append(a[0].shape) or real(*a))
    x, w, b = _operands(torch.bfloat16, rows=16, k=8, n=8)
    with torch.inference_mode():
        linear(x, w, b)  # half, CPU, enough rows: tiles
        assert calls == [(16, 8)]
        few = x[: half_linear.UPCAST_MIN_ROWS - 1]
        assert torch.equal(linear(few, w, b), F.linear(few, w, b))  # few rows: torch's half GEMV, bit for bit
        x32, w32 = x.float(), w.float()
        assert torch.equal(linear(x32, w32), F.linear(x32, w32))  # float32: untouched
    assert calls == [(16, 8)]
    trained = w.clone().requires_grad_(True)
    out = linear(x, trained)  # autograd: torch's op, so gradients flow
    out.float().sum().backward()
    assert trained.grad is not None and calls == [(16, 8)]


def test_torch_path_never_takes_tiles(monkeypatch):
    """On a CPU with native half arithmetic (or MM_INFER_HALF_GEMM=torch) every row count is torch's own GEMM."""
    monkeypatch.setattr(half_linear, "upcast_linear", lambda *a: pytest.fail("tiles on the torch path"))
    x, w, b = _operands(torch.bfloat16, rows=64, k=16, n=8)
    with forced_path("torch"), torch.inference_mode():
        assert torch.equal(linear(x, w, b), F.linear(x, w, b))


def test_linear_module_keeps_names_and_dispatches(tiles_forced):
    layer = Linear(8, 4, bias=True).to(torch.bfloat16)
    assert set(dict(layer.named_parameters())) == {"weight", "bias"}
    x = torch.randn(32, 8).to(torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(layer(x), upcast_linear(x, layer.weight, layer.bias))


def _native_or_skip(dtype: torch.dtype) -> None:
    from mm_infer.models import packed_weights
    from mm_infer.models.half_gemm_path import cpu_features

    if not (packed_weights.available() and cpu_features().native(dtype)):
        pytest.skip(f"oneDNN packs {dtype} only on a CPU with native {dtype} arithmetic")


@pytest.fixture
def packed_forced():
    from mm_infer.models import packed_weights

    packed_weights.forget()
    with forced_path("packed"):
        yield packed_weights
    packed_weights.forget()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [2, 16, 100])
def test_packed_path_is_onednn_with_one_reorder_and_torchs_maths(packed_forced, dtype, rows):
    """The packed path takes oneDNN with a weight reordered once (the copy is reused), and its rows are torch's half
    GEMM maths: float32 sums rounded once, within one rounding of the float64 reference."""
    _native_or_skip(dtype)
    x, w, b = _operands(dtype, rows=rows, k=96, n=200)
    with torch.inference_mode():
        out = linear(x.view(1, rows, 96), w, b)  # 3-D input, as the models call it
        assert out.shape == (1, rows, 200) and packed_forced.held_bytes() == w.numel() * w.element_size()
        first = packed_forced.packed(w)
        linear(x, w, b)
        assert packed_forced.packed(w) is first  # no second reorder
    exact = _float64_rounded(x, w, b).view(1, rows, 200)
    tol = 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(out, exact, rtol=tol, atol=tol)


def test_packed_copy_follows_a_refit_and_a_swapped_storage(packed_forced):
    """A stale copy would keep serving the old weights after a refit: an in-place write (version counter) and a new
    storage (adopted pages, wake-up) both rebuild it."""
    _native_or_skip(torch.bfloat16)
    x, w, b = _operands(torch.bfloat16, rows=16, k=64, n=48)
    layer = Linear(64, 48, bias=True).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(b)
    with torch.inference_mode():
        layer(x)
        with torch.no_grad():
            layer.weight.mul_(-2)  # a refit in place
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
        layer.weight.data = w.flip(0).contiguous()  # a swapped storage
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert packed_forced.held_bytes() == w.numel() * 2  # the stale copies were dropped, not kept beside


def test_packed_budget_is_a_bound_and_forget_frees(monkeypatch, packed_forced):
    """Past the byte budget a weight stays on F.linear (memory bounded by configuration); forget() drops copies,
    and a weight that is freed takes its copy with it."""
    _native_or_skip(torch.bfloat16)
    x, w, b = _operands(torch.bfloat16, rows=16, k=64, n=48)
    monkeypatch.setattr(packed_forced, "budget_bytes", lambda: w.numel() * 2)
    other = w.flip(1).contiguous()
    with torch.inference_mode():
        linear(x, w, b)
        assert packed_forced.packed(other) is None  # over the budget
        assert torch.equal(linear(x, other, b), F.linear(x, other, b))
        packed_forced.forget()
        assert packed_forced.held_bytes() == 0
        linear(x, other, b)
        assert packed_forced.held_bytes() == w.numel() * 2
        del other
        assert packed_forced.held_bytes() == 0


def test_packed_path_keeps_autograd_and_float32_on_torch(packed_forced):
    x, w, b = _operands(torch.bfloat16, rows=16, k=8, n=8)
    trained = w.clone().requires_grad_(True)
    linear(x, trained).float().sum().backward()  # autograd: torch's op, gradients flow
    assert trained.grad is not None
    x32, w32 = x.float(), w.float()
    assert torch.equal(linear(x32, w32), F.linear(x32, w32))
    assert packed_forced.held_bytes() == 0
