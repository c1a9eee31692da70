"""Structured outputs under --reasoning-parser qwen3 (issue 34.3): the grammar starts after `</think>`, so a thinking
model with response_format has room to think; a prompt that closed its think block gets the grammar at once."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from script_modules import load_script
from server_cases import API_KEY, CKPT

from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port

THINK, END_THINK = 3008, 3009  # the ids the thinking copy of the tiny checkpoint gives <think> and </think>
OPENS = "{% for m in messages %}{{ m['content'] }}{% endfor %}\n<think>\n"  # a thinking template: opens <think>
CLOSES = "{% for m in messages %}{{ m['content'] }}{% endfor %}\n<think>\n\n</think>\n\n"  # enable_thinking=False
SCHEMA = {"type": "object", "required": ["color", "n"], "additionalProperties": False,
          "properties": {"color": {"enum": ["red", "green", "blue"]},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99}}}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
COMPACT = {"disable_any_whitespace": True}  # this untrained model would fill max_tokens with JSON whitespace


@pytest.fixture(scope="module")
def http(tmp_path_factory) -> Iterator[httpx.Client]:
    make = load_script("assets.thinking_checkpoint").thinking_checkpoint
    ckpt = make(CKPT, tmp_path_factory.mktemp("thinking") / "tiny-thinking")
    config = ServerConfig(model_dir=str(ckpt), port=free_port(), api_key=API_KEY, reasoning_parser="qwen3",
                          engine_options={"num_kv_blocks": 128, "max_model_len": 1024, "batch_invariant": True})
    with BackgroundServer(config) as srv, httpx.Client(base_url=srv.base_url, timeout=120,
                                                       headers={"Authorization": f"Bearer {API_KEY}"}) as client:
        yield client


def answer(http: httpx.Client, template: str, **body) -> dict:
    body = {"model": "tiny-thinking", "messages": [{"role": "user", "content": "Pick a color."}],
            "temperature": 0.0, "max_tokens": 60, "chat_template": template, "return_token_ids": True, **body}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def chat(http: httpx.Client, template: str, **body) -> dict:
    return answer(http, template, **body)["choices"][0]


def valid(text: str | None) -> bool:
    obj = json.loads(text or "null")
    return isinstance(obj, dict) and set(obj) == {"color", "n"} and obj["color"] in ("red", "green", "blue") \
        and isinstance(obj["n"], int)


def test_the_tags_are_single_tokens(http):
    prompt = answer(http, CLOSES, max_tokens=1)["prompt_token_ids"]
    assert prompt.count(THINK) == 1 and prompt.count(END_THINK) == 1 and prompt.index(THINK) < prompt.index(END_THINK)


def test_a_thinking_model_gets_room_to_think(http):
    # the bug: the JSON grammar applied from token 0, so the model could not reason at all
    free = chat(http, OPENS, max_tokens=8)
    assert END_THINK not in free["token_ids"]  # this untrained model never closes its thought by itself
    held = chat(http, OPENS, max_tokens=8, response_format=JSON_FORMAT)
    assert held["token_ids"] == free["token_ids"] and held["finish_reason"] == "length"
    assert held["message"]["reasoning"] == free["message"]["reasoning"] and held["message"]["content"] is None


def test_the_grammar_starts_after_the_end_tag(http):
    # </think> forced first (logit_bias): the answer after it follows the schema, and the bias cannot bring the
    # tag back once the grammar applies
    choice = chat(http, OPENS, response_format=JSON_FORMAT, structured_outputs=COMPACT,
                  logit_bias={str(END_THINK): 100})
    assert choice["token_ids"][0] == END_THINK and END_THINK not in choice["token_ids"][1:]
    assert valid(choice["message"]["content"]), choice["message"]
    assert choice["finish_reason"] == "stop" and not choice["message"]["reasoning"]


def test_a_prompt_that_closed_its_thought_is_constrained_from_token_zero(http):
    # enable_thinking=False renders <think>\n\n</think>\n\n: the output is the answer, held to the schema at once
    choice = chat(http, CLOSES, response_format=JSON_FORMAT, structured_outputs=COMPACT)
    assert valid(choice["message"]["content"]) and choice["finish_reason"] == "stop"
    assert choice["message"]["reasoning"] is None
