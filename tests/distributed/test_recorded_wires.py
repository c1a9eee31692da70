"""Answers recorded on the thread wire come out the same on every wire and family: the engine-core process and
2 Ray replicas move outputs between processes, and must not change a token, a reason or a logprob past the bound."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from recorded_compare import LOGPROB_ATOL
from recorded_compare import differences as compare
from recorded_wires import FAMILIES, RECORD, serve_and_ask


def _split(value: Any, floats: list[float]) -> Any:
    """The value with every repr'd float replaced by a marker (compared exactly), the floats collected in order."""
    if isinstance(value, dict):
        return {k: _split(v, floats) for k, v in value.items()}
    if isinstance(value, list):
        # a logprob entry is [token, "float", {token: "float"}]
        if len(value) == 3 and isinstance(value[0], str) and isinstance(value[1], str) and isinstance(value[2], dict):
            floats.append(float(value[1]))
            tops = {}
            for k, v in value[2].items():
                floats.append(float(v))
                tops[k] = "<float>"
            return [value[0], "<float>", tops]
        return [_split(v, floats) for v in value]
    return value


def _skeleton(case: Any) -> tuple[Any, list[float]]:
    floats: list[float] = []
    return _split(case, floats), floats


def differences(recorded: dict[str, Any], now: dict[str, Any], atol: float = LOGPROB_ATOL) -> list[str]:
    return compare(recorded, now, _skeleton, atol)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("wire", ["thread", "process", "replicas"])
def test_every_wire_gives_the_recorded_answers(wire, family, request):
    # catches: a lost or repeated delta, a chunk boundary that drops a logprob, a cumulative/delta mix-up, a wire
    # that reorders choices or loses a stop reason, and any change to the maths (the thread wire against the record)
    if wire == "replicas":
        request.getfixturevalue("local_ray")
    recorded = json.loads(RECORD.read_text())[family]
    assert differences(recorded, json.loads(json.dumps(serve_and_ask(family, wire)))) == []


def test_the_wire_guard_sees_a_lost_token_and_a_moved_logprob():
    recorded = json.loads(RECORD.read_text())["qwen2"]
    dropped = copy.deepcopy(recorded)
    dropped["video_chat_stream"][1]["token_ids"].pop()
    assert differences(recorded, dropped) == ["video_chat_stream: ids, text, reasons or top-k tokens differ"]
    moved = copy.deepcopy(recorded)
    entry = moved["image_chat"]["choices"][0]["logprobs"][3]
    entry[1] = repr(float(entry[1]) + 5e-5)
    assert differences(recorded, moved) == ["image_chat: a logprob differs by 5.00e-05 > 1e-05"]
