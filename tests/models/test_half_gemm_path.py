"""The half-type GEMM path follows the CPU's instruction sets, can be forced, and is reported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from mm_infer.models import half_gemm_path as hgp
from mm_infer.models import packed_weights
from mm_infer.models.half_gemm_path import CpuFeatures, forced_path, half_gemm_path

AVX2 = CpuFeatures("avx2 box", "AVX2", avx512_bf16=False, amx_bf16=False, avx512_fp16=False, amx_fp16=False)
ZEN5 = CpuFeatures("zen 5", "AVX512", avx512_bf16=True, amx_bf16=False, avx512_fp16=False, amx_fp16=False)
SPR = CpuFeatures("sapphire rapids", "AVX512", avx512_bf16=True, amx_bf16=True, avx512_fp16=True, amx_fp16=False)
NATIVE = "packed" if packed_weights.available() else "torch"  # oneDNN's prepacked ops are in every CPU build of torch


@pytest.mark.parametrize(("cpu", "bf16", "fp16"), [(AVX2, "tiles", "tiles"), (ZEN5, NATIVE, "tiles"),
                                                   (SPR, NATIVE, NATIVE)])
def test_auto_path_follows_native_half_arithmetic(monkeypatch, cpu, bf16, fp16):
    monkeypatch.setattr(hgp, "cpu_features", lambda: cpu)
    monkeypatch.setattr(hgp, "_env_path", lambda: None)
    hgp._auto_path.cache_clear()
    try:
        assert (half_gemm_path(torch.bfloat16), half_gemm_path(torch.float16)) == (bf16, fp16)
    finally:
        hgp._auto_path.cache_clear()


@pytest.mark.parametrize(("cpu", "bf16", "fp16"), [(AVX2, False, False), (ZEN5, True, False), (SPR, True, False)])
def test_single_rows_take_mv_only_for_native_bf16(monkeypatch, cpu, bf16, fp16):
    monkeypatch.setattr(hgp, "cpu_features", lambda: cpu)
    hgp.mv_for_single_rows.cache_clear()
    try:
        assert (hgp.mv_for_single_rows(torch.bfloat16), hgp.mv_for_single_rows(torch.float16)) == (bf16, fp16)
    finally:
        hgp.mv_for_single_rows.cache_clear()


def test_single_row_dispatch_is_mv_with_float32_sums(monkeypatch):
    from mm_infer.models import half_linear

    monkeypatch.setattr(half_linear, "mv_for_single_rows", lambda dtype: True)
    calls = []
    real = torch.mv
    monkeypatch.setattr(half_linear.torch, "mv", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=gen).bfloat16() for s in ((1, 1, 64), (48, 64), (48,)))
    with torch.inference_mode():
        out = half_linear.linear(x, w, b)
        assert calls == [(48, 64)] and out.shape == (1, 1, 48)
        exact = (x.double().view(1, 64) @ w.double().t()).view(1, 1, 48).bfloat16() + b
        torch.testing.assert_close(out, exact, rtol=1e-2, atol=1e-2)
        half_linear.linear(x.expand(1, 2, 64), w)  # two rows: F.linear, not mv
    assert calls == [(48, 64)]


def test_forced_path_wins_and_is_undone():
    auto = half_gemm_path(torch.bfloat16)
    for path in ("packed", "torch", "tiles"):
        with forced_path(path):
            assert half_gemm_path(torch.bfloat16) == half_gemm_path(torch.float16) == path
    assert half_gemm_path(torch.bfloat16) == auto
    with pytest.raises(ValueError, match="unknown half GEMM path"), forced_path("fast"):  # type: ignore[arg-type]
        pass


def _probe(env_value: str) -> subprocess.CompletedProcess[str]:
    code = "import torch; from mm_infer.models.half_gemm_path import half_gemm_path as p; print(p(torch.bfloat16))"
    env = {**os.environ, hgp.ENV: env_value}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_environment_forces_the_path_in_a_new_process():
    assert _probe("tiles").stdout.strip() == "tiles"
    assert _probe("torch").stdout.strip() == "torch"
    assert _probe("packed").stdout.strip() == "packed"
    bad = _probe("fastest")
    assert bad.returncode != 0 and "MM_INFER_HALF_GEMM='fastest'" in bad.stderr


def test_describe_names_the_cpu_and_each_path():
    info = hgp.describe()
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert info["half_gemm_bf16"] in hgp.PATHS and info["half_gemm_fp16"] in hgp.PATHS
    assert info["cpu"]


def test_env_command_and_version_say_what_runs(capsys):
    import json

    from mm_infer import cli

    assert cli.main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("torch", "triton", "transformers", "cpu", "cpu_capability", "half_gemm_bf16", "half_gemm_fp16"):
        assert report[key], key
    assert report["half_gemm_bf16"] == half_gemm_path(torch.bfloat16)
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    line = capsys.readouterr().out
    assert done.value.code == 0 and f"torch={torch.__version__}" in line and "half_gemm_bf16=" in line
