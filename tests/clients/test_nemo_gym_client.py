"""NeMo-Gym 0.4.0's real `vllm_model` server (run in .peers/nemo-gym-venv) pointed at ours: a two-turn Responses
rollout with an image collects our exact ids and logprobs, and turn 2's prompt begins with turn 1's exact ids."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from client_cases import CKPT, IMAGE, MODEL, NEMO_PYTHON, image_url, needs_venv, run_driver

from mm_infer import LLM, SamplingParams

pytestmark = [pytest.mark.clients, needs_venv(NEMO_PYTHON, "responses_api_models")]

QUESTION = "What colour is the shape?"  # nemo_gym_driver.py's first turn
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def rollout(our_server: str) -> dict[str, Any]:
    result, seconds = run_driver(NEMO_PYTHON, "nemo_gym_driver.py", [our_server, MODEL, str(IMAGE)])
    result["driver_seconds"] = seconds
    return result


def _message(response: dict[str, Any]) -> dict[str, Any]:
    """The training message (NeMo-Gym's *ForTraining output item): the one that carries token ids."""
    items = [o for o in response["output"] if "generation_token_ids" in o]
    assert len(items) == 1, response["output"]
    return items[0]


def test_turn_one_collects_our_ids_and_logprobs(rollout: dict[str, Any], our_server: str) -> None:
    got = _message(rollout["turn1"])
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url()}},
                                         {"type": "text", "text": QUESTION}]}]
    r = httpx.post(f"{our_server}/v1/chat/completions", timeout=120, json={
        "model": MODEL, "messages": msgs, "temperature": 0, "max_tokens": MAX_TOKENS, "logprobs": True,
        "return_token_ids": True})
    ours = r.json()
    assert got["prompt_token_ids"] == ours["prompt_token_ids"]
    assert [int(t) for t in got["generation_token_ids"]] == ours["choices"][0]["token_ids"]
    want = [t["logprob"] for t in ours["choices"][0]["logprobs"]["content"]]
    assert got["generation_log_probs"] == pytest.approx(want, abs=1e-5)
    assert got["content"][0]["text"] == ours["choices"][0]["message"]["content"] == "red"


def test_turn_two_prompt_begins_with_turn_one_ids(rollout: dict[str, Any]) -> None:
    first, second = _message(rollout["turn1"]), _message(rollout["turn2"])
    sent_back = [m for m in rollout["turn2_input"] if m.get("role") == "assistant"]
    assert sent_back and sent_back[0]["prompt_token_ids"] == first["prompt_token_ids"], "Gym sends the ids back"
    prefix = first["prompt_token_ids"] + [int(t) for t in first["generation_token_ids"]]
    assert second["prompt_token_ids"][:len(prefix)] == prefix
    assert len(second["prompt_token_ids"]) > len(prefix) + 5, "the second user turn follows"
    assert second["prompt_token_ids"].count(3006) == first["prompt_token_ids"].count(3006), "image not re-expanded"


def test_turn_two_generation_equals_our_engine_on_that_prompt(rollout: dict[str, Any]) -> None:
    """Our offline engine, given turn 2's exact (already expanded) ids and the image, samples the same tokens."""
    second = _message(rollout["turn2"])
    llm = LLM(str(CKPT), num_kv_blocks=64, max_model_len=1024)
    out = llm.generate([{"prompt_token_ids": second["prompt_token_ids"], "media_tokens_preexpanded": True,
                         "multi_modal_data": {"image": [str(IMAGE)]}}],
                       SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=0))[0]
    assert out.prompt_token_ids == second["prompt_token_ids"]
    assert [int(t) for t in second["generation_token_ids"]] == out.outputs[0].token_ids
    assert second["generation_log_probs"] == pytest.approx(out.outputs[0].logprobs, abs=1e-4)
