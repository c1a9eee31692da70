"""Answer size is bounded: the logprobs one request could carry (n x new tokens x (1 + top k), plus the prompt's)
are capped by --max-logprob-entries, a 400 naming the cap before any work, on chat, completions and generate."""

from __future__ import annotations

import pytest
from server_cases import CKPT, MAX_MODEL_LEN
from test_errors import assert_error, chat, post

from mm_infer.engine.sampling.params import SamplingParams
from servers.cli import parse_args, server_config
from servers.openai.bodies.errors import ApiError
from servers.openai.prompting.admission import check_answer_size

CAP = "--max-logprob-entries"


def test_the_issue_request_is_a_400_naming_the_cap(server):
    """Issue 32 (High 7): n=64, max_tokens=1500, logprobs, top_logprobs 20, ignore_eos grew RSS by 1.65 GB and
    answered 153 MB."""
    limit = server.state.config.max_logprob_entries
    body = chat("go", n=64, max_tokens=1500, logprobs=True, top_logprobs=20, ignore_eos=True, temperature=1.0)
    err = assert_error(post(server, "/v1/chat/completions", body), 400, CAP)
    assert err["param"] == "top_logprobs" and str(limit) in err["message"]
    assert f"n=64 x {MAX_MODEL_LEN} tokens x (1 + 20 top logprobs)" in err["message"]  # max_tokens clamped first
    assert not server.state.backend.core.groups


def test_without_max_tokens_the_context_left_by_the_prompt_counts(server):
    """No max_tokens: each sample may run to the end of the context, so that is what is counted (after tokenizing)."""
    body = chat("go", n=60, logprobs=True, top_logprobs=20)
    body.pop("max_tokens")
    err = assert_error(post(server, "/v1/chat/completions", body), 400, CAP)
    assert "n=60 x " in err["message"] and f"x {MAX_MODEL_LEN} tokens" not in err["message"]


def test_completions_count_every_prompt_and_sample(server):
    body = {"prompt": ["a", "b", "c", "d"], "n": 16, "max_tokens": 1000, "logprobs": 20, "temperature": 1.0}
    err = assert_error(post(server, "/v1/completions", body), 400, CAP)
    assert err["param"] == "logprobs" and "over 4 prompts" in err["message"]


def test_prompt_logprobs_count_too(server):
    """Each completion choice repeats the prompt's logprobs: n x prompt length x (1 + prompt_logprobs)."""
    body = {"prompt": [7] * 1000, "n": 50, "max_tokens": 1, "prompt_logprobs": 20, "temperature": 1.0}
    err = assert_error(post(server, "/v1/completions", body), 400, CAP)
    assert err["param"] == "prompt_logprobs" and "50 x 1000 prompt tokens x (1 + 20 prompt logprobs)" in err["message"]


def test_generate_is_capped_the_same_way(server):
    body = {"token_ids": [7, 8, 9], "sampling_params": {"n": 64, "max_tokens": 1000, "logprobs": 20}}
    err = assert_error(post(server, "/inference/v1/generate", body), 400, CAP)
    assert err["param"] == "sampling_params.logprobs"


def test_answers_within_the_cap_are_served(server):
    r = post(server, "/v1/chat/completions", chat("hi", n=2, max_tokens=3, logprobs=True, top_logprobs=20))
    assert r.status_code == 200, r.text
    assert all(len(c["logprobs"]["content"]) == 3 for c in r.json()["choices"])
    r = post(server, "/inference/v1/generate", {"token_ids": [7, 8], "sampling_params": {"max_tokens": 2,
                                                                                          "logprobs": 5}})
    assert r.status_code == 200, r.text


def test_the_count():
    params = SamplingParams(n=4, max_tokens=10, logprobs=2, prompt_logprobs=1)
    check_answer_size(params, 100, 4 * 10 * 3 + 2 * 50 * 2, [50], prompt_copies=2)  # exactly at the cap
    with pytest.raises(ApiError, match=CAP):
        check_answer_size(params, 100, 4 * 10 * 3 + 2 * 50 * 2 - 1, [50], prompt_copies=2)
    room = SamplingParams(n=2, max_tokens=None, logprobs=0)
    check_answer_size(room, 100, 1, [None])  # not tokenized yet, no max_tokens: nothing counted yet
    check_answer_size(room, 100, 2 * 30, [70])  # the prompt leaves 30 tokens
    with pytest.raises(ApiError, match="n=2 x 30 tokens"):
        check_answer_size(room, 100, 2 * 30 - 1, [70])
    check_answer_size(SamplingParams(n=128, max_tokens=None), 10**6, 1, [10])  # no logprobs asked: no cap


def test_the_flag():
    assert server_config(parse_args(["serve", str(CKPT)])).max_logprob_entries == 1 << 20
    assert server_config(parse_args(["serve", str(CKPT), "--max-logprob-entries", "2K"])).max_logprob_entries == 2048
