"""Request fields map onto SamplingParams one to one; what cannot be honoured is a 400."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.requests import ChatCompletionRequest, CompletionRequest
from servers.openai.bodies.sampling_params import to_sampling_params

MSG = [{"role": "user", "content": "x"}]


def test_every_field_is_mapped():
    req = ChatCompletionRequest(
        messages=MSG, n=3, temperature=0.7, top_p=0.9, top_k=20, min_p=0.05, seed=11, max_completion_tokens=33,
        min_tokens=2, stop=["END"], stop_token_ids=[7], include_stop_str_in_output=True, ignore_eos=True,
        presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.2, logit_bias={"5": -3.0},
        logprobs=True, top_logprobs=4, prompt_logprobs=0, logprobs_mode="processed_logprobs",
        skip_special_tokens=False)
    p = to_sampling_params(req, vocab_size=3008)
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (3, 0.7, 0.9, 20, 0.05, 11)
    assert (p.max_tokens, p.min_tokens, p.stop_list, p.stop_token_ids) == (33, 2, ["END"], [7])
    assert p.include_stop_str_in_output and p.ignore_eos and not p.skip_special_tokens
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -0.5, 1.2)
    assert p.logit_bias == {5: -3.0}
    assert (p.logprobs, p.prompt_logprobs, p.logprobs_mode) == (4, 0, "processed_logprobs")


def test_defaults():
    p = to_sampling_params(ChatCompletionRequest(messages=MSG), vocab_size=3008)
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.logprobs) == (1.0, 1.0, 0, None, None)
    assert to_sampling_params(CompletionRequest(prompt="x"), vocab_size=3008).max_tokens == 16
    assert to_sampling_params(CompletionRequest(prompt="x", logprobs=0), vocab_size=3008).logprobs == 0


@pytest.mark.parametrize("fields, words", [
    ({"logit_bias": {"abc": 1.0}}, "logit_bias"), ({"logit_bias": {"99999": 1.0}}, "logit_bias"),
    ({"logit_bias": {"5": 500.0}}, "[-100, 100]"), ({"stop_token_ids": [99999]}, "stop_token_ids"),
    ({"min_tokens": 9, "max_tokens": 3}, "min_tokens"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"logprobs_mode": "processed_logits"}, "logprobs_mode"), ({"min_p": 2.0}, "min_p"),
])
def test_rejections_name_the_field(fields, words):
    """Range checks live in the request model (a pydantic 400 naming the field) or in to_sampling_params."""
    with pytest.raises((ApiError, ValidationError)) as e:
        to_sampling_params(ChatCompletionRequest(messages=MSG, **fields), vocab_size=3008)
    if isinstance(e.value, ValidationError):
        assert words in str(e.value)
    else:
        assert e.value.status == 400 and words in e.value.message


def test_include_stop_str_in_output_live(client):
    base = client.completions.create(model="m", prompt="abc", max_tokens=6, temperature=0).choices[0].text
    at = next((k for k in range(1, len(base) - 1) if base.find(base[k:k + 2]) == k), None)
    assert at is not None, f"no usable stop string in {base!r}"
    stop = base[at:at + 2]
    kept = client.completions.create(model="m", prompt="abc", max_tokens=6, temperature=0, stop=[stop],
                                     extra_body={"include_stop_str_in_output": True}).choices[0].text
    cut = client.completions.create(model="m", prompt="abc", max_tokens=6, temperature=0, stop=[stop])
    assert kept == base[:at + 2] and cut.choices[0].text == base[:at]
