"""vLLM 0.32's request rules (issue 34): nulls, OpenAI's own fields, developer role, tokenize pieces, unknown models."""

from __future__ import annotations

import json

import httpx
import pytest
from server_cases import API_KEY, CKPT, MAX_MODEL_LEN

from mm_infer.prompt.templating import developer_as_system

AUTH = {"Authorization": f"Bearer {API_KEY}"}
USER = [{"role": "user", "content": "hi"}]
NULLS = {"n": None, "stream": None, "logprobs": None, "echo": None, "presence_penalty": None,
         "frequency_penalty": None, "return_token_ids": None, "return_tokens_as_token_ids": None}
# OpenAI's chat fields at values that leave the answer as it is (vLLM accepts and ignores them)
OPENAI_IGNORED = {"store": True, "metadata": {"k": "v"}, "service_tier": "auto", "prompt_cache_key": "key-1",
                  "prompt_cache_retention": "24h", "safety_identifier": "user-1", "verbosity": "low",
                  "prediction": {"type": "content", "content": "hello"}, "modalities": ["text"], "audio": None,
                  "web_search_options": None, "functions": None, "function_call": "auto"}


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers=AUTH, timeout=120)


def chat(server, **kw) -> httpx.Response:
    return post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 3, "temperature": 0, **kw})


def complete(server, **kw) -> httpx.Response:
    return post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 3, "temperature": 0, **kw})


def answer(r: httpx.Response) -> list[tuple[str | None, str]]:
    assert r.status_code == 200, r.text
    return [((c.get("message") or {}).get("content", c.get("text")), c["finish_reason"]) for c in r.json()["choices"]]


def refused(r: httpx.Response, field: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and "not supported by this server" in err["message"], err


def test_explicit_null_means_the_default(server):
    assert answer(chat(server, **NULLS)) == answer(chat(server))
    assert answer(complete(server, **NULLS, best_of=None)) == answer(complete(server))
    r = chat(server, stream=True, stream_options={"include_usage": None, "continuous_usage_stats": None})
    assert r.status_code == 200, r.text
    assert [c.get("usage") is not None for c in chunks(r)][-1:] == [True]  # include_usage's default: true


def chunks(r: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def test_openai_fields_vllm_ignores_are_accepted_and_change_nothing(server):
    assert answer(chat(server, **OPENAI_IGNORED)) == answer(chat(server))
    r = chat(server, stream=True, stream_options={"include_obfuscation": True})
    assert r.status_code == 200 and "obfuscation" not in r.text
    assert answer(complete(server, best_of=1)) == answer(complete(server))
    assert post(server, "/v1/responses", {"input": "hi", "max_output_tokens": 2, "prompt_cache_key": "k",
                                          "safety_identifier": "s", "prompt_cache_retention": "in_memory",
                                          "stream_options": {"include_obfuscation": False}}).status_code == 200


@pytest.mark.parametrize("field,value", [
    ("modalities", ["text", "audio"]), ("audio", {"voice": "alloy", "format": "wav"}), ("web_search_options", {}),
    ("functions", [{"name": "f", "parameters": {}}]), ("function_call", {"name": "f"})])
def test_openai_fields_that_would_change_the_answer_are_400s(server, field, value):
    refused(chat(server, **{field: value}), field)


def test_best_of_above_one_is_refused(server):
    refused(complete(server, best_of=2), "best_of")


def _tokens(server, messages: list[dict]) -> list[int]:
    r = post(server, "/tokenize", {"messages": messages})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_developer_role_renders_as_system(server):
    developer = _tokens(server, [{"role": "developer", "content": "Be terse."}, *USER])
    assert developer == _tokens(server, [{"role": "system", "content": "Be terse."}, *USER])
    text = post(server, "/detokenize", {"tokens": developer}).json()["prompt"]
    assert "developer" not in text and "You are a helpful assistant" not in text  # no default system prompt


def test_developer_role_kept_where_the_template_names_it():
    msgs = [{"role": "developer", "content": "x"}, {"role": "user", "content": "y"}]
    assert developer_as_system(msgs, "{% if m.role == 'developer' %}{% endif %}") == msgs
    assert [m["role"] for m in developer_as_system(msgs, "{{ messages }}")] == ["system", "user"]
    assert [m["role"] for m in developer_as_system(msgs, None)] == ["system", "user"]  # the fallback template


def test_tokenize_token_strs_are_vocabulary_pieces(server):
    r = post(server, "/tokenize", {"prompt": "hi a\n", "return_token_strs": True}).json()
    assert "Ġa" in r["token_strs"] and "Ċ" in r["token_strs"] and len(r["token_strs"]) == r["count"]


def test_tokenize_an_empty_prompt_is_zero_tokens(server):
    r = post(server, "/tokenize", {"prompt": ""})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["count"], body["tokens"], body["max_model_len"], body["token_strs"]) == (0, [], MAX_MODEL_LEN, None)
    assert post(server, "/tokenize", {"prompt": "", "return_token_strs": True}).json()["token_strs"] == []


UNKNOWN_MODEL_BODIES = [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 1}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 1, "stream": True}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1}), ("/v1/responses", {"input": "hi"}),
    ("/v1/chat/completions/render", {"messages": USER}), ("/v1/completions/render", {"prompt": "hi"}),
    ("/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"max_tokens": 1}}),
    ("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1, 2]})]


@pytest.mark.parametrize("path,body", UNKNOWN_MODEL_BODIES)
def test_an_unknown_model_is_vllms_404(server, path, body):
    r = post(server, path, {**body, "model": "gpt-4o"})
    assert r.status_code == 404, r.text
    assert r.json() == {"error": {"message": "The model `gpt-4o` does not exist.", "type": "NotFoundError",
                                  "param": "model", "code": 404}}


@pytest.mark.parametrize("model", [CKPT.name, "m", "", None, str(CKPT)])  # str(CKPT): vLLM serves the path as given
def test_served_names_and_no_name_are_accepted(server, model):
    body = {"prompt": "hi"} if model is None else {"prompt": "hi", "model": model}  # "m": conftest's alias
    assert post(server, "/tokenize", body).status_code == 200
    assert complete(server, **({} if model is None else {"model": model})).status_code == 200
