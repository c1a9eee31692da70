"""Admission is all or nothing: every parameter is checked at the API (a 400 naming it) before any costly work."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_cases import API_KEY, MAX_MODEL_LEN
from test_errors import assert_error, chat, frozen_after_first_token, post

from servers.openai.prompting.admission import MAX_LOGIT_BIAS, MAX_STOP_CHARS, MAX_STOP_STRINGS, text_char_limit

AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}


def raw_post(server, path: str, body: str) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", content=body.encode(), headers=AUTH, timeout=60)


def completion(**kw) -> dict:
    return {"prompt": "hi", "max_tokens": 2, "temperature": 0, **kw}


def test_a_top_seed_with_n_2_neither_fails_nor_bricks_the_engine(server):
    """F1: seed 2^64-1 with n=2 (sample 1 gets seed+1) once left an orphan sequence that broke every request."""
    r = post(server, "/v1/chat/completions", chat("hello", n=2, seed=2**64 - 1, temperature=1.0, max_tokens=4))
    assert r.status_code == 200 and len(r.json()["choices"]) == 2
    assert post(server, "/v1/chat/completions", chat("after")).status_code == 200
    assert not server.state.backend.core.groups


@pytest.mark.parametrize("field", ["temperature", "top_p", "presence_penalty", "repetition_penalty", "min_p"])
@pytest.mark.parametrize("value", ["1e999", "NaN", "-Infinity"])
def test_non_finite_numbers_are_a_400_naming_the_field(server, field, value):
    body = f'{{"messages": [{{"role": "user", "content": "x"}}], "max_tokens": 2, "{field}": {value}}}'
    err = assert_error(raw_post(server, "/v1/chat/completions", body), 400, field)
    assert err["param"] == field


def test_non_finite_logit_bias_values_are_a_400(server):
    body = '{"prompt": "x", "max_tokens": 2, "logit_bias": {"5": NaN}}'
    assert_error(raw_post(server, "/v1/completions", body), 400, "logit_bias")


@pytest.mark.parametrize("field, value", [("top_k", -2), ("min_p", 1.5), ("repetition_penalty", 0.0), ("n", 0)])
def test_out_of_range_sampling_fields_name_themselves(server, field, value):
    assert assert_error(post(server, "/v1/completions", completion(**{field: value})), 400, field)["param"] == field


def test_stop_strings_are_capped_in_number_and_length(server):
    """F9: 10k stop strings slowed every request in the engine about 12x."""
    many = [f"s{i}" for i in range(MAX_STOP_STRINGS + 1)]
    assert_error(post(server, "/v1/completions", completion(stop=many)), 400, f"limit of {MAX_STOP_STRINGS}")
    assert_error(post(server, "/v1/completions", completion(stop=["x" * (MAX_STOP_CHARS + 1)])), 400,
                 "stop string of")
    assert post(server, "/v1/completions", completion(stop=many[:MAX_STOP_STRINGS])).status_code == 200


def test_logit_bias_is_capped(server):
    bias = {str(i): 1.0 for i in range(MAX_LOGIT_BIAS + 1)}
    assert_error(post(server, "/v1/completions", completion(logit_bias=bias)), 400, "logit_bias has")


def test_prompts_times_n_is_capped(server):
    """F9: 200 prompts x n=64 (12,800 sequences from a 10 KB body) blocked a 4-token request for 19.7 s."""
    limit = server.state.config.max_sequences_per_request
    r = post(server, "/v1/completions", completion(prompt=["a"] * (limit // 64 + 1), n=64))
    assert_error(r, 400, "--max-sequences-per-request")
    assert not server.state.backend.core.groups


class _EncodeSpy:
    """Stands in for the `tokenizers` backend: records the length of every text handed to an encode method."""

    def __init__(self, real) -> None:
        self.real, self.lengths = real, []

    def __getattr__(self, name: str):
        attr = getattr(self.real, name)
        if not name.startswith("encode"):
            return attr

        def encode(inputs, *args, **kwargs):
            self.lengths += [len(t) for t in ([inputs] if isinstance(inputs, str) else inputs) if isinstance(t, str)]
            return attr(inputs, *args, **kwargs)
        return encode


def test_text_too_long_for_the_context_is_refused_before_tokenizing(server, monkeypatch):
    """F4: 10 MB of text took 11 s and 2.4 GB to tokenize before its 400. What is promised is the order (the count
    of characters is checked first), so the test watches the tokenizer, not a clock."""
    tokenizer = server.state.preparer.tokenizer
    limit = text_char_limit(tokenizer, MAX_MODEL_LEN)
    spy = _EncodeSpy(tokenizer.backend)
    monkeypatch.setattr(tokenizer, "backend", spy)
    text = "ab " * (limit // 3 + 1)
    for path, body in (("/v1/completions", completion(prompt=text)), ("/v1/chat/completions", chat(text)),
                       ("/tokenize", {"prompt": text}), ("/v1/completions", completion(prompt=["ok", text]))):
        err = assert_error(post(server, path, body), 400, "characters of text")
        assert err["param"] in ("prompt", "messages")
        assert all(n < len(text) for n in spy.lengths), f"{path} tokenized the text before refusing it"
    assert post(server, "/tokenize", {"prompt": "ok"}).status_code == 200 and spy.lengths, "the spy sees encodes"


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", chat("a\ud800b")),
    ("/v1/chat/completions", chat([{"type": "text", "text": "\udfff"}])),
    ("/v1/completions", completion(prompt="x\ud800")),
    ("/v1/completions", completion(stop=["\udbff"])),
    ("/tokenize", {"prompt": "\ud800"}),
    ("/v1/responses", {"input": "hi \ud800", "max_output_tokens": 2}),
])
def test_a_lone_surrogate_is_a_400_not_a_500(server, path, body):
    """F12: a lone surrogate reached the tokenizer, which raised TypeError: a 500."""
    assert_error(raw_post(server, path, json.dumps(body)), 400, "surrogate")  # json.dumps escapes it as \\ud800


def test_a_request_id_in_flight_cannot_be_reused(server):
    """F5: a duplicate request_id replaced the first request's pause ticket, so /pause missed it."""
    long = completion(max_tokens=400, min_tokens=400, request_id="dup")
    with ThreadPoolExecutor(1) as ex:
        with frozen_after_first_token(server, "cmpl-dup-0") as frozen:  # in flight until we thaw, however fast
            first = ex.submit(post, server, "/v1/completions", long)
            assert frozen.wait(60) and not first.done(), "the request never got going"
            assert_error(post(server, "/v1/completions", completion(request_id="dup")), 400, "already in use")
        assert first.result(timeout=120).status_code == 200
    assert post(server, "/v1/completions", completion(request_id="dup")).status_code == 200


def test_sampling_params_that_break_the_logits_are_a_400_not_a_pad_token(server):
    """F14: repetition_penalty=1e-300 made NaN logits and the sampler emitted <|video_pad|>."""
    r = post(server, "/v1/completions", completion(prompt="hello hello", repetition_penalty=1e-300, temperature=1.0,
                                                   seed=3))
    assert_error(r, 400, "repetition_penalty")
    assert post(server, "/v1/completions", completion()).status_code == 200
