"""Issue 32's mediums: /inference/v1/generate has chat's stop and logit_bias caps; unclear 400s name the problem;
oversize ints never reach the engine; HEAD /health; a bounded weight-transfer timeout; non-local $refs refused."""

from __future__ import annotations

import json

import httpx
import pytest
from server_cases import MEDIA, data_url
from test_errors import assert_error, chat, post

from servers.openai.bodies.requests import ChatCompletionRequest
from servers.openai.bodies.sampling_params import to_sampling_params
from servers.openai.prompting.admission import MAX_LOGIT_BIAS, MAX_STOP_CHARS, MAX_STOP_STRINGS

INT70 = 2**70


def generate(**sampling) -> dict:
    return {"token_ids": [7, 8, 9], "sampling_params": {"max_tokens": 2, **sampling}}


@pytest.mark.parametrize("sampling, words", [
    ({"stop": ["x" * 100_000]}, f"limit of {MAX_STOP_CHARS}"),
    ({"stop": [f"s{i}" for i in range(MAX_STOP_STRINGS + 1)]}, f"limit of {MAX_STOP_STRINGS}"),
    ({"logit_bias": {"5": 3e38}}, "outside [-100, 100]"),
    ({"logit_bias": {str(i): 1.0 for i in range(MAX_LOGIT_BIAS + 1)}}, f"limit of {MAX_LOGIT_BIAS}"),
])
def test_generate_has_the_stop_and_logit_bias_caps_chat_has(server, sampling, words):
    err = assert_error(post(server, "/inference/v1/generate", generate(**sampling)), 400, words)
    assert err["param"] == f"sampling_params.{next(iter(sampling))}"


def test_chat_logit_bias_values_are_still_capped(server):
    assert_error(post(server, "/v1/chat/completions", chat("x", logit_bias={"5": 3e38})), 400, "outside [-100, 100]")


@pytest.mark.parametrize("key", ["²", "٣", "1" * 5000, "5.0", " 5"])
def test_a_logit_bias_key_that_is_no_token_id_is_named(server, key):
    """"²".isdigit() is True: int("²") raised "invalid literal for int()" (and 5000 digits past int's limit)."""
    err = assert_error(post(server, "/v1/chat/completions", chat("x", logit_bias={key: 5})), 400,
                       "is not a token id")
    assert err["param"] == "logit_bias" and repr(key)[:40] in err["message"]


@pytest.mark.parametrize("path, body, field", [
    ("/v1/chat/completions", chat("x", max_tokens=INT70), "max_tokens"),
    ("/v1/chat/completions", chat("x", max_completion_tokens=INT70), "max_completion_tokens"),
    ("/v1/chat/completions", chat("x", top_k=INT70), "top_k"),
    ("/v1/chat/completions", chat("x", min_tokens=INT70), "min_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": INT70}, "max_tokens"),
    ("/inference/v1/generate", generate(max_tokens=INT70), "sampling_params.max_tokens"),
    ("/inference/v1/generate", generate(top_k=INT70), "sampling_params.top_k"),
    ("/inference/v1/generate", generate(min_tokens=INT70), "sampling_params.min_tokens"),
])
def test_ints_past_int64_are_a_400_naming_the_field(server, path, body, field):
    err = assert_error(post(server, path, body), 400, field)
    assert err["param"] == field


def test_counts_past_the_context_or_vocabulary_are_clamped_before_the_engine(server):
    """max_tokens / min_tokens past max_model_len are clamped to it, top_k past the vocabulary is off (vLLM's input
    batch): what reaches the engine always fits."""
    vocab, max_len = server.state.backend.facts.vocab_size, server.state.backend.facts.max_model_len
    params = to_sampling_params(ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], top_k=10**9),
                                vocab)
    assert params.top_k == 0
    assert to_sampling_params(ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], top_k=5),
                              vocab).top_k == 5
    r = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 10**12, "top_k": 10**12, "temperature": 1.0,
                                         "seed": 1, "stop_token_ids": list(range(vocab))[:1000]})
    assert r.status_code == 200, r.text
    r = post(server, "/v1/chat/completions/render", chat("x", max_tokens=10**12, min_tokens=10**12, top_k=10**12))
    assert r.status_code == 200, r.text
    sampling = r.json()["sampling_params"]
    assert sampling["max_tokens"] == sampling["min_tokens"] == max_len and "top_k" not in sampling


def test_head_health_is_200(server):
    assert httpx.head(f"{server.base_url}/health").status_code == 200
    assert httpx.head(f"{server.base_url}/ping").status_code == 200


@pytest.mark.parametrize("timeout", [1e300, 3601, 0])
def test_weight_transfer_timeout_is_bounded(server, timeout):
    info = {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 2,
            "timeout_s": timeout}
    err = assert_error(post(server, "/init_weight_transfer_engine", {"init_info": info}), 400, "timeout_s")
    assert "init_info.timeout_s" in err["param"]


@pytest.mark.parametrize("ref", ["https://example.com/schema.json", "file:///etc/passwd", "other.json", "#anchor"])
def test_a_json_schema_ref_outside_the_schema_is_a_400_naming_it(server, ref):
    """xgrammar 0.2.9 warns and allows any value for such a $ref: the answer was 200 and free, non-JSON text."""
    schema = {"type": "object", "properties": {"a": {"$ref": ref}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    err = assert_error(post(server, "/v1/chat/completions", chat("x", response_format=fmt)), 400, "$ref")
    assert ref in err["message"] and "/properties/a/$ref" in err["message"] and err["param"] == "response_format"
    body = {"prompt": "x", "max_tokens": 2, "structured_outputs": {"json": {"$ref": ref}}}
    assert assert_error(post(server, "/v1/completions", body), 400, ref)["param"] == "structured_outputs"
    gen = generate(structured_outputs={"json": json.dumps({"$ref": ref})})
    assert_error(post(server, "/inference/v1/generate", gen), 400, ref)


def test_forced_tool_parameters_with_a_remote_ref_are_refused(server):
    # a strict tool's parameters become the arguments' grammar: a remote $ref there is refused, never fetched. A tool
    # without strict is not held to its schema (vLLM's tool strict level auto), so its parameters are never compiled
    remote = {"$ref": "https://example.com/p.json"}
    tools = [{"type": "function", "function": {"name": "f", "parameters": remote, "strict": True}}]
    body = chat("x", tools=tools, tool_choice="required")
    assert assert_error(post(server, "/v1/chat/completions", body), 400, "$ref")["param"] == "tool_choice"
    loose = [{"type": "function", "function": {"name": "f", "parameters": remote}}]
    assert post(server, "/v1/chat/completions", chat("x", tools=loose, tool_choice="required")).status_code == 200


def test_local_refs_still_constrain_the_output(server):
    schema = {"$defs": {"Flag": {"type": "boolean"}}, "type": "object", "properties": {"ok": {"$ref": "#/$defs/Flag"}},
              "required": ["ok"], "additionalProperties": False}
    body = chat("x", max_tokens=32, temperature=1.0, seed=3, response_format={
        "type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        structured_outputs={"disable_any_whitespace": True})
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop" and isinstance(json.loads(choice["message"]["content"])["ok"], bool)


def _video_chat(url: str, **kw) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                                      {"type": "text", "text": "x"}]}], "max_tokens": 2, **kw}


def test_num_frames_1_names_the_rounding(server):
    video = data_url(MEDIA / "videos" / "pan_h264_24fps.mp4", "video/mp4")
    r = post(server, "/v1/chat/completions", _video_chat(video, mm_processor_kwargs={"num_frames": 1}))
    assert_error(r, 400, "num_frames 1 rounds to 0")
    assert "at least 2" in r.json()["error"]["message"]


def test_an_image_sent_as_a_video_says_so(server):
    r = post(server, "/v1/chat/completions", _video_chat(data_url(MEDIA / "images" / "photo.png", "image/png")))
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "temporal patch needs 2 frames" in message and "image_url" in message, message

