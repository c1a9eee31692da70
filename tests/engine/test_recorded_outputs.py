"""Outputs recorded before a restructuring must come out the same after it, on any CPU: ids, text, finish and stop
reasons and top-k token sets exactly; every logprob within LOGPROB_ATOL (DESIGN.md, "Portable exactness")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from recorded_cases import MODELS, RECORD, run

# The recording was made on an AVX2-only CPU; the BLAS build and torch's vectorised kernels pick the order of
# summation, so float bits are not portable (the ids, text and reasons are). Logprobs here are float32 in
# [-10.3, 0], where one ulp is at most 9.5e-7. Measured on an Intel Xeon with AVX512-BF16 and AMX (all 400
# recorded floats, both models): the largest spread of any logprob between the recording and this machine under
# ATEN_CPU_CAPABILITY=default / avx2 / avx512 / unset, and MKL_ENABLE_INSTRUCTIONS=AVX2 / SSE4_2, is 3.8e-6
# (4 ulp); 1e-5 leaves 2.6x headroom. A real change in our maths moves them 10x past it: doubling the RMSNorm eps
# (1e-6 -> 2e-6) keeps every id and moves logprobs by 9.9e-5 (qwen2) and 1.3e-4 (qwen25): the test below.
LOGPROB_ATOL = 1e-5


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
    if sorted(now) != sorted(recorded):
        return [f"cases {sorted(now)} != recorded {sorted(recorded)}"]
    found = []
    for name in recorded:
        (want, want_f), (got, got_f) = _split(recorded[name]), _split(now[name])
        if got != want:
            found.append(f"{name}: ids, text, reasons or top-k tokens differ")
            continue
        worst = max((abs(a - b) for a, b in zip(want_f, got_f, strict=True)), default=0.0)
        if worst > atol:
            found.append(f"{name}: a logprob differs by {worst:.2e} > {atol:.0e}")
    return found


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
