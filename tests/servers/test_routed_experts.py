"""R3 over HTTP, in vLLM 0.32's contract: `routed_experts` (base64 .npy) on chat and completions choices and on
/inference/v1/generate (its last streamed chunk), through the engine-core process, equal to the offline engine's."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from server_cases import API_KEY

from mm_infer import LLM, SamplingParams
from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port

CKPT = Path(__file__).resolve().parents[2] / "assets" / "models" / "tiny-qwen3-vl-moe"
OPTIONS = {"num_kv_blocks": 128, "max_model_len": 1024, "cpu_threads": 1, "batch_invariant": True}
MESSAGES = [{"role": "user", "content": "Name three rivers."}]
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def decode(encoded: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(encoded)), allow_pickle=False)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    config = ServerConfig(model_dir=str(CKPT), port=free_port(), api_key=API_KEY, served_model_name="moe",
                          engine_core="process", engine_options={**OPTIONS, "enable_return_routed_experts": True})
    server = BackgroundServer(config).start()
    yield server.base_url
    server.stop()


@pytest.fixture(scope="module")
def offline() -> LLM:
    return LLM(str(CKPT), enable_return_routed_experts=True, **OPTIONS)


def post(base: str, path: str, body: dict) -> dict:
    reply = httpx.post(base + path, json={"model": "moe", **body}, headers=HEADERS, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_chat_choices_carry_the_offline_routing_each_its_own(base, offline):
    # catches: the field left null, a choice given another's rows, the wire dropping the array, a wrong encoding
    body = post(base, "/v1/chat/completions", {"messages": MESSAGES, "n": 2, "temperature": 1.0, "seed": 7,
                                                "max_tokens": 6, "return_token_ids": True})
    want = offline.generate([{"messages": MESSAGES}], SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=6),
                            use_tqdm=False)[0]
    for choice, sample in zip(body["choices"], want.outputs, strict=True):
        got = decode(choice["routed_experts"])
        assert choice["token_ids"] == sample.token_ids and got.dtype == np.uint8
        assert np.array_equal(got, sample.routed_experts)
        assert got.shape == (len(want.prompt_token_ids) + len(sample.token_ids) - 1, 3, 2)


def test_completions_honour_the_prompt_start(base):
    # catches: routed_experts_prompt_start not reaching the engine, or a start past the prompt taken
    full = post(base, "/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0.0})
    part = post(base, "/v1/completions", {"prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0.0,
                                          "routed_experts_prompt_start": 2})
    rows = decode(full["choices"][0]["routed_experts"])
    assert np.array_equal(decode(part["choices"][0]["routed_experts"]), rows[2:])
    bad = httpx.post(base + "/v1/completions", json={"model": "moe", "prompt": "The quick brown fox", "max_tokens": 2,
                                                     "routed_experts_prompt_start": 99}, headers=HEADERS)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "routed_experts_prompt_start"
    neg = httpx.post(base + "/v1/completions", json={"model": "moe", "prompt": "x", "routed_experts_prompt_start": -1},
                     headers=HEADERS)
    assert neg.status_code == 400


def test_generate_returns_it_whole_and_on_the_last_streamed_chunk(base):
    # catches: /inference/v1/generate without the field, or a stream that sends it before the end or in pieces
    ids = post(base, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 1,
                                         "return_token_ids": True})["choices"][0]["prompt_token_ids"]
    body = {"token_ids": ids, "sampling_params": {"temperature": 0.0, "max_tokens": 5}}
    whole = post(base, "/inference/v1/generate", body)["choices"][0]
    rows = decode(whole["routed_experts"])
    assert rows.shape == (len(ids) + len(whole["token_ids"]) - 1, 3, 2)
    chunks = []
    with httpx.stream("POST", base + "/inference/v1/generate", json={"model": "moe", **body, "stream": True},
                      headers=HEADERS, timeout=120) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks += json.loads(line[6:]).get("choices", [])
    carrying = [c for c in chunks if c.get("routed_experts")]
    assert len(carrying) == 1 and carrying[0] is chunks[-1] and carrying[0]["finish_reason"] == "length"
    assert np.array_equal(decode(carrying[0]["routed_experts"]), rows)


def test_chat_streams_carry_none_as_vllms(base):
    with httpx.stream("POST", base + "/v1/chat/completions", json={"model": "moe", "messages": MESSAGES,
                                                                    "max_tokens": 3, "stream": True},
                      headers=HEADERS, timeout=120) as reply:
        lines = [line for line in reply.iter_lines() if line.startswith("data: {")]
    assert lines and not any("routed_experts" in line for line in lines)


def test_render_then_generate_keeps_the_prompt_start(base):
    # catches: render dropping routed_experts_prompt_start from the sampling params it hands to generate
    rendered = post(base, "/v1/chat/completions/render", {"messages": MESSAGES, "max_tokens": 3, "temperature": 0.0,
                                                          "routed_experts_prompt_start": 4})
    assert rendered["sampling_params"]["routed_experts_prompt_start"] == 4
    body = {k: rendered[k] for k in ("token_ids", "sampling_params")}
    choice = post(base, "/inference/v1/generate", body)["choices"][0]
    assert decode(choice["routed_experts"]).shape[0] == len(rendered["token_ids"]) + len(choice["token_ids"]) - 1 - 4
