"""Dispatcher: backend choice and the MM_INFER_KERNELS switch, and that both backends agree on every op."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import frames_u8

from mm_infer_kernels import dispatch
from mm_infer_kernels import fused_patchify as pf

# Max abs difference between the triton and torch backends per op (patch_embed: relative to max |ref|).
TOLERANCE = {"patchify": 0.0, "patch_embed_fp32": 5e-6, "vision_rope": 0.0, "patch_merge": 0.0}


def test_auto_picks_by_device(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.zeros(1)
    assert dispatch.select_backend(cpu) == "torch"
    assert dispatch.select_backend() == "torch"
    monkeypatch.setenv("MM_INFER_KERNELS", "auto")
    assert dispatch.select_backend(cpu) == "torch"
    if torch.cuda.is_available():
        monkeypatch.delenv("MM_INFER_KERNELS")
        assert dispatch.select_backend(cpu.cuda()) == "triton"
        assert dispatch.select_backend(cpu.cuda(), cpu) == "torch"


def test_env_forces_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MM_INFER_KERNELS", "torch")
    assert dispatch.select_backend(torch.zeros(1)) == "torch"
    monkeypatch.setenv("MM_INFER_KERNELS", "Triton")
    if dispatch.interpreting():
        assert dispatch.select_backend(torch.zeros(1)) == "triton"
    else:
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            dispatch.select_backend(torch.zeros(1))
    monkeypatch.setenv("MM_INFER_KERNELS", "cuda")
    with pytest.raises(ValueError, match="MM_INFER_KERNELS"):
        dispatch.select_backend(torch.zeros(1))


def test_env_switch_routes_the_call(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> None:
    calls: list[str] = []
    real = pf.patchify_packed_triton

    def counting(*args, **kwargs):
        calls.append("triton")
        return real(*args, **kwargs)

    monkeypatch.setattr(pf, "patchify_packed_triton", counting)
    frames = frames_u8(1, 28, 28).to(device)
    monkeypatch.setenv("MM_INFER_KERNELS", "torch")
    ref = dispatch.patchify(frames)
    assert calls == []
    monkeypatch.setenv("MM_INFER_KERNELS", "triton")
    if device.type == "cpu" and not dispatch.interpreting():
        pytest.skip("CPU tensors need the interpreter")
    out = dispatch.patchify(frames)
    assert calls == ["triton"] and torch.equal(out, ref)


def both(monkeypatch: pytest.MonkeyPatch, fn, *args, **kwargs):
    """(triton result, torch result) of one dispatcher call."""
    monkeypatch.setenv("MM_INFER_KERNELS", "triton")
    a = fn(*args, **kwargs)
    monkeypatch.setenv("MM_INFER_KERNELS", "torch")
    return a, fn(*args, **kwargs)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def test_backends_agree(monkeypatch: pytest.MonkeyPatch, device: torch.device) -> None:
    if device.type == "cpu" and not dispatch.interpreting():
        pytest.skip("CPU tensors need the interpreter")
    items = [frames_u8(1, 28, 28).to(device), frames_u8(3, 56, 28, seed=1).to(device)]
    a, b = both(monkeypatch, dispatch.patchify, items, out_dtype=torch.bfloat16)
    assert a.shape == (4 + 16, 1176) and max_diff(a, b) <= TOLERANCE["patchify"]
    buf, offs, thw = dispatch.pack_frames(items)
    assert torch.equal(dispatch.grid_thw(thw), torch.tensor([[1, 2, 2], [2, 4, 2]]))
    w = torch.randn(24, 3, 2, 14, 14, device=device) * 0.02
    a, b = both(monkeypatch, dispatch.patch_embed_packed, buf, offs, thw, w)
    assert max_diff(a, b) <= TOLERANCE["patch_embed_fp32"] * b.abs().max().item()
    a, b = both(monkeypatch, dispatch.patch_embed_packed, buf, offs, thw, w, fused=False)
    assert torch.equal(a, b)
    grid = dispatch.grid_thw(thw)
    q, k = torch.randn(2, 20, 2, 16, device=device)
    (qa, ka), (qb, kb) = both(monkeypatch, dispatch.vision_rope_from_grid, q, k, grid)
    assert max(max_diff(qa, qb), max_diff(ka, kb)) <= TOLERANCE["vision_rope"]
    a, b = both(monkeypatch, dispatch.patch_merge, torch.randn(20, 40, device=device), grid)
    assert max_diff(a, b) <= TOLERANCE["patch_merge"]


def test_torch_backend_checks_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MM_INFER_KERNELS", "torch")
    with pytest.raises(AssertionError, match="multiples of 28"):
        dispatch.patchify(frames_u8(1, 28, 42))
    q = torch.randn(4, 2, 16)
    with pytest.raises(AssertionError, match="cos must be"):
        dispatch.vision_rope(q, q, torch.zeros(3, 16), torch.zeros(4, 16))


def test_pack_frames_checks_items() -> None:
    with pytest.raises(AssertionError, match="no items"):
        dispatch.pack_frames([])
    with pytest.raises(AssertionError, match="uint8"):
        dispatch.pack_frames([torch.zeros(1, 28, 28, 3)])
