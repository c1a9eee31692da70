"""What runs here: package versions, the CPU, torch's kernel level and the half GEMM path, for logs and bug reports."""

from __future__ import annotations

import platform
from importlib import metadata

import torch

from mm_infer.models.half_gemm_path import describe as describe_gemm

PACKAGES = ("mm-infer", "torch", "triton", "transformers", "tokenizers", "safetensors", "av", "xgrammar")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def runtime_report() -> dict[str, str]:
    """One flat record: versions, python, the CPU and its half GEMM paths, and the CUDA device when there is one."""
    report = {name: _version(name) for name in PACKAGES}
    report["python"] = platform.python_version()
    report.update(describe_gemm())
    report["cpu_threads"] = str(torch.get_num_threads())
    report["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return report


def one_line() -> str:
    """The report as `key=value` pairs on one line (the server's start-up log)."""
    return " ".join(f"{k}={v!r}" if " " in v else f"{k}={v}" for k, v in runtime_report().items())
