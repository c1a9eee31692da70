"""NeMo-Gym 0.4.0's real `vllm_model` server (run in .peers/nemo-gym-venv) against ours on the hybrid tiny models
(Nemotron Omni, Qwen3.5-MoE): a two-turn Responses rollout with an image; turn 2's prompt begins with turn 1's exact
ids (the image run kept)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from client_cases import NEMO_PYTHON, REPO, image_url, needs_venv, run_driver
from serve_process import start_serve, stop_serve

from mm_infer import LLM, SamplingParams
from servers.openai.launch import free_port

pytestmark = [pytest.mark.clients, needs_venv(NEMO_PYTHON, "responses_api_models")]

HYBRID = {"nemotron-omni": (REPO / "assets" / "models" / "tiny-nemotron-omni", 3003),  # <image>
          "qwen3.5-moe": (REPO / "assets" / "models" / "tiny-qwen3.5-moe", 3006)}  # <|image_pad|>
IMAGE = REPO / "assets" / "media" / "images" / "photo.png"
QUESTION = "What colour is the shape?"  # nemo_gym_driver.py's first turn
MAX_TOKENS = 8
ENGINE = {"num_kv_blocks": 256, "max_model_len": 2048}


@pytest.fixture(scope="module", params=sorted(HYBRID))
def hybrid(request) -> tuple[Path, int]:  # noqa: ANN001
    return HYBRID[request.param]


@pytest.fixture(scope="module")
def omni_server(hybrid: tuple[Path, int]) -> Iterator[str]:
    proc, base = start_serve([str(hybrid[0]), "--max-model-len", "2048", "--num-kv-blocks", "256"], free_port())
    yield base
    stop_serve(proc)


@pytest.fixture(scope="module")
def rollout(omni_server: str, hybrid: tuple[Path, int]) -> dict[str, Any]:
    result, _ = run_driver(NEMO_PYTHON, "nemo_gym_driver.py", [omni_server, hybrid[0].name, str(IMAGE)])
    return result


def _message(response: dict[str, Any]) -> dict[str, Any]:
    """The training message (NeMo-Gym's *ForTraining output item): the one that carries token ids."""
    items = [o for o in response["output"] if "generation_token_ids" in o]
    assert len(items) == 1, response["output"]
    return items[0]


def test_turn_one_collects_our_ids_and_logprobs(rollout: dict[str, Any], omni_server: str,
                                                hybrid: tuple[Path, int]) -> None:
    ckpt, image_token = hybrid
    got = _message(rollout["turn1"])
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url(IMAGE)}},
                                         {"type": "text", "text": QUESTION}]}]
    ours = httpx.post(f"{omni_server}/v1/chat/completions", timeout=120, json={
        "model": ckpt.name, "messages": msgs, "temperature": 0, "max_tokens": MAX_TOKENS, "logprobs": True,
        "return_token_ids": True}).json()
    assert got["prompt_token_ids"] == ours["prompt_token_ids"] and image_token in got["prompt_token_ids"]
    assert [int(t) for t in got["generation_token_ids"]] == ours["choices"][0]["token_ids"]
    want = [t["logprob"] for t in ours["choices"][0]["logprobs"]["content"]]
    assert got["generation_log_probs"] == pytest.approx(want, abs=1e-5)


def test_turn_two_begins_with_turn_one_ids_and_equals_our_engine(rollout: dict[str, Any],
                                                                 hybrid: tuple[Path, int]) -> None:
    first, second = _message(rollout["turn1"]), _message(rollout["turn2"])
    prefix = first["prompt_token_ids"] + [int(t) for t in first["generation_token_ids"]]
    assert second["prompt_token_ids"][:len(prefix)] == prefix
    assert len(second["prompt_token_ids"]) > len(prefix) + 5, "the second user turn follows"
    assert second["prompt_token_ids"].count(hybrid[1]) == first["prompt_token_ids"].count(hybrid[1])
    out = LLM(str(hybrid[0]), **ENGINE).generate(
        [{"prompt_token_ids": second["prompt_token_ids"], "media_tokens_preexpanded": True,
          "multi_modal_data": {"image": [str(IMAGE)]}}],
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=0), use_tqdm=False)[0]
    assert out.prompt_token_ids == second["prompt_token_ids"]
    assert [int(t) for t in second["generation_token_ids"]] == out.outputs[0].token_ids
    assert second["generation_log_probs"] == pytest.approx(out.outputs[0].logprobs, abs=1e-4)
