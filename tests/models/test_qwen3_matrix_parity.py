"""scripts/peers/parity.py (fixed image / video / multi-turn suite) on tiny Qwen3-VL, dense and MoE: two of our servers
agree bit for bit, and ours agrees with the HF transformers reference server (--start-hf) on ids and logprobs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from qwen3_cases import QWEN3
from script_modules import load_script

OPTIONS = {"num_kv_blocks": 256, "max_model_len": 2048, "cpu_threads": 1}


@pytest.fixture(scope="module")
def parity() -> ModuleType:
    return load_script("peers.parity")


@pytest.fixture(scope="module", params=sorted(QWEN3))
def ours(request) -> Iterator[tuple[str, Any]]:
    from servers.openai.config import ServerConfig
    from servers.openai.launch import BackgroundServer, free_port

    threads = torch.get_num_threads()
    start = lambda: BackgroundServer(ServerConfig(model_dir=str(QWEN3[request.param]), port=free_port(),  # noqa: E731
                                                  engine_options=OPTIONS)).start()
    a, b = start(), start()
    yield request.param, a, b
    a.stop()
    b.stop()
    torch.set_num_threads(threads)


def _run(parity: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> dict[str, Any]:
    out = tmp_path / "report.json"
    report = parity.main([*argv, "--out", str(out), "--reset-prefix-cache"])
    assert capsys.readouterr().out.strip().splitlines()[-1] == report["summary"]
    assert json.loads(out.read_text())["aggregate"] == report["aggregate"]
    return report


def test_ours_vs_ours_is_exact(parity, ours, capsys, tmp_path):
    kind, a, b = ours
    report = _run(parity, capsys, tmp_path, "--a", a.base_url, "--b", f"{b.base_url}/v1")
    agg = report["aggregate"]
    assert {r["suite"] for r in report["requests"]} == {"image", "video", "multiturn"}
    assert agg["errors"] == 0 and agg["turns"] == 8 and report["notes"] == [], report["notes"]
    assert agg["compare"] == "ids" and agg["prompt_ids_match"] == 1.0 and agg["exact_match"] == 1.0
    assert agg["max_dlogprob"] == 0.0 and agg["token_mult_prob_error"] == 1.0
    second = report["requests"][-1]["turns"][1]["metrics"]
    assert second["a_carried_prefix"] is True and second["b_carried_prefix"] is True


def test_ours_vs_hf_reference(parity, ours, capsys, tmp_path):
    kind, a, _ = ours
    report = _run(parity, capsys, tmp_path, "--a", a.base_url, "--start-hf", str(QWEN3[kind]))
    agg = report["aggregate"]
    assert agg["errors"] == 0 and report["notes"] == [] and agg["compare"] == "ids", report["notes"]
    assert agg["turns"] == 8 and agg["prompt_ids_match"] == 1.0 and agg["exact_match"] == 1.0
    assert agg["max_dlogprob"] < 1e-4 and 1.0 <= agg["token_mult_prob_error"] < 1.0 + 1e-4
    assert report["requests"][-1]["turns"][1]["metrics"]["b_carried_prefix"] is True
