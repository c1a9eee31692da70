"""Fixtures for model tests: our models and the HF oracle, loaded once; max-diff collection."""

from __future__ import annotations

import os

import pytest
import torch
from model_cases import CHECKPOINTS

from mm_infer.models import load_model

if not torch.cuda.is_available():  # the Triton-path tests run in the interpreter here (read at the first launch)
    os.environ.setdefault("TRITON_INTERPRET", "1")

DIFFS: dict[str, float] = {}


@pytest.fixture(params=sorted(CHECKPOINTS), scope="session")
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def ours(kind):
    """(model, config) loaded by our loader in float32."""
    return load_model(CHECKPOINTS[kind], dtype=torch.float32)


_HF: dict[str, torch.nn.Module] = {}


@pytest.fixture(scope="session")
def hf_model(kind):
    """The transformers oracle for the same checkpoint, float32, eval."""
    if kind not in _HF:
        from transformers import AutoModelForImageTextToText

        _HF[kind] = AutoModelForImageTextToText.from_pretrained(CHECKPOINTS[kind], dtype=torch.float32).eval()
    return _HF[kind]


@pytest.fixture
def record():
    """record(case, diff): keep the largest diff seen per case for the summary table."""

    def _record(case: str, diff: float) -> float:
        DIFFS[case] = max(diff, DIFFS.get(case, 0.0))
        return diff

    return _record


def pytest_terminal_summary(terminalreporter) -> None:
    if DIFFS:
        terminalreporter.section("model parity: max abs diff vs transformers (float32)")
        for case, diff in sorted(DIFFS.items()):
            terminalreporter.write_line(f"{case:60s} {diff:.3e}")
