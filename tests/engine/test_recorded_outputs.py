"""Outputs recorded before a restructuring must come out the same after it, on any CPU: ids, text, finish and stop
reasons and top-k token sets exactly; every logprob within LOGPROB_ATOL (DESIGN.md, "Portable exactness")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from recorded_cases import MODELS, RECORD, run
from recorded_compare import LOGPROB_ATOL
from recorded_compare import differences as compare


def _split(record: dict[str, Any]) -> tuple[dict[str, Any], list[float]]:
    """(the record with every float replaced by a marker: compared exactly, the floats in order: within the bound)."""
    floats: list[float] = []

    def f(text: str) -> str:
        if text == "None":  # the first prompt token has no logprob
            return text
        floats.append(float(text))
        return "<float>"

    skeleton = {
        "prompt_token_ids": record["prompt_token_ids"],
        "prompt_logprobs": None if record["prompt_logprobs"] is None else [f(x) for x in record["prompt_logprobs"]],
        "samples": [{**s, "logprobs": [f(x) for x in s["logprobs"]],
                     "top_logprobs": None if s["top_logprobs"] is None else
                     [{k: f(v) for k, v in t.items()} for t in s["top_logprobs"]]}
                    for s in record["samples"]],
    }
    return skeleton, floats


def differences(recorded: dict[str, Any], now: dict[str, Any], atol: float = LOGPROB_ATOL) -> list[str]:
    """What differs between two recordings of one model: any non-float, or a float off by more than atol."""
    return compare(recorded, now, _split, atol)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_outputs_equal_the_recorded_ones(model):
    # catches: any change to row order, padding, M-RoPE, media order, sampling draws, detokenisation or the maths
    recorded = json.loads(RECORD.read_text())[model]
    assert differences(recorded, run(model)) == []


def test_the_guard_catches_a_change_in_the_maths():
    """The bound is tight enough to see a change that keeps every id, and a dropped bias changes the ids."""
    from mm_infer.models.layers import RMSNorm

    def double_rms_eps(model) -> None:
        for mod in model.modules():
            if isinstance(mod, RMSNorm):
                mod.eps *= 2

    def drop_last_qkv_bias(model) -> None:
        dict(model.named_parameters())["language.layers.1.self_attn.qkv_proj.bias"].data.zero_()

    recorded = json.loads(RECORD.read_text())["qwen2"]
    now = run("qwen2", double_rms_eps)
    eps = differences(recorded, now)
    assert eps and all("logprob differs" in d for d in eps), eps  # ids kept: only the float bound sees it
    assert differences(recorded, now, atol=5 * LOGPROB_ATOL)  # by 1.0e-4: far past the bound on any CPU
    assert any("ids, text" in d for d in differences(recorded, run("qwen2", drop_last_qkv_bias)))
