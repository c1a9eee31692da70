"""Outputs recorded before a restructuring must come out bit for bit the same after it."""

from __future__ import annotations

import json

import pytest
from recorded_cases import MODELS, RECORD, run


@pytest.mark.parametrize("model", sorted(MODELS))
def test_outputs_equal_the_recorded_ones_bit_for_bit(model):
    # catches: any change to row order, padding, M-RoPE, media order, sampling draws or detokenisation
    recorded = json.loads(RECORD.read_text())[model]
    now = run(model)
    assert sorted(now) == sorted(recorded)
    for name in recorded:
        assert now[name] == recorded[name], f"{model}/{name} differs from the recorded output"
