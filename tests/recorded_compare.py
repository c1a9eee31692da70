"""A fresh run against a recording: everything but the floats exactly, every float within a bound."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# The recordings were made on an AVX2-only CPU; the BLAS build and torch's vectorised kernels pick the order of
# summation, so float bits are not portable (the ids, text and reasons are). Logprobs here are float32 in
# [-10.3, 0], where one ulp is at most 9.5e-7. Measured on an Intel Xeon with AVX512-BF16 and AMX (all 400
# recorded floats of the offline record, both models): the largest spread of any logprob between the recording
# and this machine under ATEN_CPU_CAPABILITY=default / avx2 / avx512 / unset, and MKL_ENABLE_INSTRUCTIONS=AVX2 /
# SSE4_2, is 3.8e-6 (4 ulp); 1e-5 leaves 2.6x headroom. A real change in our maths moves them 10x past it:
# doubling the RMSNorm eps (1e-6 -> 2e-6) keeps every id and moves logprobs by 9.9e-5 (qwen2) and 1.3e-4 (qwen25).
LOGPROB_ATOL = 1e-5

Split = Callable[[Any], tuple[Any, list[float]]]  # a case -> (its skeleton, floats replaced by markers; the floats)


def differences(recorded: dict[str, Any], now: dict[str, Any], split: Split,
                atol: float = LOGPROB_ATOL) -> list[str]:
    """Per case: any non-float that differs, or a float off by more than atol."""
    if sorted(now) != sorted(recorded):
        return [f"cases {sorted(now)} != recorded {sorted(recorded)}"]
    found = []
    for name in recorded:
        (want, want_f), (got, got_f) = split(recorded[name]), split(now[name])
        if got != want:
            found.append(f"{name}: ids, text, reasons or top-k tokens differ")
            continue
        worst = max((abs(a - b) for a, b in zip(want_f, got_f, strict=True)), default=0.0)
        if worst > atol:
            found.append(f"{name}: a logprob differs by {worst:.2e} > {atol:.0e}")
    return found
