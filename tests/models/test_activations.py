"""Activations equal HF's, bit for bit, on the in-place inference path and the autograd path."""

from __future__ import annotations

import pytest
import torch
from transformers.activations import QuickGELUActivation

from mm_infer.models.layers import quick_gelu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quick_gelu_equals_hf(dtype):
    # catches: an in-place variant that rounds differently (a fused sigmoid, a product in another order) or that
    # writes over its input
    x = (torch.randn(257, 129, generator=torch.Generator().manual_seed(0)) * 6).to(dtype)
    want = QuickGELUActivation()(x)
    keep = x.clone()
    with torch.inference_mode():
        assert torch.equal(quick_gelu(x), want)
    assert torch.equal(x, keep)
    y = x.float().requires_grad_()
    out = quick_gelu(y)
    out.sum().backward()  # the autograd path stays differentiable
    assert torch.equal(out.detach(), QuickGELUActivation()(x.float())) and y.grad is not None
