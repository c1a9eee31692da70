"""Importing the kernels or the model needs no triton and leaves os.environ alone; the torch references compute."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kernel_cases import REPO, dispatch_ops

from mm_infer_kernels import dispatch

NO_TRITON = """
import sys
sys.modules["triton"] = None  # `import triton` now raises ImportError
sys.path.insert(0, "tests/kernels")
import torch
from kernel_cases import dispatch_ops
torch.save(dispatch_ops(), sys.argv[1])
import mm_infer.models
from mm_infer_kernels import dispatch
from mm_infer_kernels.vision_rope import vision_rope_triton
assert dispatch.select_backend(torch.zeros(1)) == "torch"
q = torch.zeros(4, 1, 16)
cos, sin = dispatch.vision_rope_cos_sin([[1, 2, 2]], 16)
try:
    vision_rope_triton(q, q, cos, sin)
except RuntimeError as e:
    assert "triton installed" in str(e), e
else:
    raise AssertionError("a Triton launcher ran without triton")
"""


def run_python(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter at the repo root, without TRITON_INTERPRET / MM_INFER_KERNELS."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "MM_INFER_KERNELS")}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_importing_the_model_leaves_the_environment_unchanged() -> None:
    code = ("import os, sys; before = dict(os.environ); import mm_infer, mm_infer.models, mm_infer_kernels.dispatch; "
            "assert dict(os.environ) == before, set(os.environ.items()) ^ set(before.items()); "
            "assert 'mm_infer_kernels._jit' not in sys.modules, 'a @triton.jit module was imported'")
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr


def test_references_compute_without_triton(tmp_path: Path) -> None:
    out = tmp_path / "ops.pt"
    proc = run_python(NO_TRITON, str(out))
    assert proc.returncode == 0, proc.stderr
    expected, got = dispatch_ops(), torch.load(out)
    assert got.keys() == expected.keys()
    for name, ref in expected.items():
        assert torch.equal(got[name], ref), name


def test_forced_triton_without_triton_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch._triton, "available", lambda: False)
    monkeypatch.setenv("MM_INFER_KERNELS", "triton")
    with pytest.raises(RuntimeError, match="triton installed"):
        dispatch.select_backend(torch.zeros(1))
    monkeypatch.setenv("MM_INFER_KERNELS", "auto")
    assert dispatch.select_backend(torch.zeros(1)) == "torch"


@pytest.mark.skipif(torch.cuda.is_available() or not dispatch._triton.available(),
                    reason="the interpreter is switched on lazily only on hosts without CUDA, with triton")
def test_first_cpu_launch_turns_on_the_interpreter() -> None:
    code = ("import os, torch; from mm_infer_kernels import dispatch; "
            "from mm_infer_kernels.vision_rope import vision_rope_triton\n"
            "assert 'TRITON_INTERPRET' not in os.environ\n"
            "q = torch.randn(4, 2, 16); cos, sin = dispatch.vision_rope_cos_sin([[1, 2, 2]], 16)\n"
            "out = vision_rope_triton(q, q, cos, sin)\n"
            "assert os.environ['TRITON_INTERPRET'] == '1'\n"
            "ref = dispatch.vision_rope(q, q, cos, sin)\n"
            "assert all(torch.equal(a, b) for a, b in zip(out, ref))\n")
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
