"""The half-type GEMM path follows the CPU's instruction sets, can be forced, and is reported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from mm_infer.models import half_gemm_path as hgp
from mm_infer.models.half_gemm_path import CpuFeatures, forced_path, half_gemm_path

AVX2 = CpuFeatures("avx2 box", "AVX2", avx512_bf16=False, amx_bf16=False, avx512_fp16=False, amx_fp16=False)
ZEN5 = CpuFeatures("zen 5", "AVX512", avx512_bf16=True, amx_bf16=False, avx512_fp16=False, amx_fp16=False)
SPR = CpuFeatures("sapphire rapids", "AVX512", avx512_bf16=True, amx_bf16=True, avx512_fp16=True, amx_fp16=False)


@pytest.mark.parametrize(("cpu", "bf16", "fp16"), [(AVX2, "tiles", "tiles"), (ZEN5, "torch", "tiles"),
                                                   (SPR, "torch", "torch")])
def test_auto_path_follows_native_half_arithmetic(monkeypatch, cpu, bf16, fp16):
    monkeypatch.setattr(hgp, "cpu_features", lambda: cpu)
    monkeypatch.setattr(hgp, "_env_path", lambda: None)
    hgp._auto_path.cache_clear()
    try:
        assert (half_gemm_path(torch.bfloat16), half_gemm_path(torch.float16)) == (bf16, fp16)
    finally:
        hgp._auto_path.cache_clear()


def test_forced_path_wins_and_is_undone():
    auto = half_gemm_path(torch.bfloat16)
    for path in ("torch", "tiles"):
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
    bad = _probe("fastest")
    assert bad.returncode != 0 and "MM_INFER_HALF_GEMM='fastest'" in bad.stderr


def test_describe_names_the_cpu_and_each_path():
    info = hgp.describe()
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert info["half_gemm_bf16"] in ("torch", "tiles") and info["half_gemm_fp16"] in ("torch", "tiles")
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
