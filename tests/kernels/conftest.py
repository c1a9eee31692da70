"""Kernel tests run Triton on CUDA when present, else in the CPU interpreter (set here, before any Triton launch)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

if not torch.cuda.is_available():  # importing the kernels no longer sets it; @triton.jit reads it at the first launch
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICES = ["cuda"] if torch.cuda.is_available() else ["cpu"]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    """The device Triton kernels run on here: CUDA on a GPU machine, CPU (interpreter) otherwise."""
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _no_forced_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from the dispatcher's automatic choice."""
    monkeypatch.delenv("MM_INFER_KERNELS", raising=False)



@pytest.fixture(autouse=True)
def _no_tf32() -> Iterator[None]:
    """fp32 references (matmul, HF's Conv3d through cuDNN) must not use TF32 on GPUs that have it."""
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn
