"""Stream shape as vLLM 0.32 / OpenAI send it (issue 34): reasoning that a re-parse moves, reasoning cut off before
</think>, prompt ids on the first completion chunk, one choice per chunk, the chunk schema's nullable keys."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest
from server_cases import API_KEY, CKPT
from transformers import AutoTokenizer

from mm_infer.engine.outputs.request_output import CompletionOutput, RequestOutput
from servers.openai.answers.parsers import build_output_parser
from servers.openai.bodies.requests import ChatCompletionRequest
from servers.openai.endpoints.chat import _delta, _Sent, chat_response

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MSG = [{"role": "user", "content": "Describe a quiet street."}]
OPENS_THINK = "{% for m in messages %}{{ m['content'] }}{% endfor %}\n<think>\n"  # a template that opens <think>


def _post(server, path: str, body: dict) -> dict:
    body = {**body, "model": server.state.config.model_name}
    r = httpx.post(f"{server.base_url}{path}", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _chunks(server, path: str, body: dict) -> list[dict]:
    body = {**body, "model": server.state.config.model_name, "stream": True}
    with httpx.stream("POST", f"{server.base_url}{path}", json=body, headers=AUTH,
                      timeout=120) as resp:
        assert resp.status_code == 200
        lines = [ln for ln in resp.iter_lines() if ln.startswith("data: {")]
    return [json.loads(ln.removeprefix("data: ")) for ln in lines]


def _streamed(chunks: list[dict]) -> tuple[str, str]:
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    return "".join(d.get("reasoning") or "" for d in deltas), "".join(d.get("content") or "" for d in deltas)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(CKPT))


def _state(tokenizer) -> SimpleNamespace:
    return SimpleNamespace(parser=build_output_parser("qwen3", "hermes"), preparer=SimpleNamespace(tokenizer=tokenizer),
                           config=SimpleNamespace(model_name="tiny"), backend=SimpleNamespace(weight_version=0))


def test_reasoning_moved_by_the_end_tag_does_not_stop_the_content(tokenizer):
    """34.1: the prompt opened <think>, the model only emits </think>; content used to stop at "abc" for good."""
    req = ChatCompletionRequest(messages=MSG, stream=True)
    sent, choices = _Sent(opened=True), []
    pieces = ["abc", "</th", "ink>def", "ghijkl"]
    for i, text in enumerate(pieces):
        final = i == len(pieces) - 1
        choices.append(_delta(_state(tokenizer), req, CompletionOutput(0, text, [i], [0.0], "stop" if final else None),
                              sent))
    reasoning = "".join(c["delta"].get("reasoning", "") for c in choices)
    content = "".join(c["delta"].get("content", "") for c in choices)
    assert (reasoning, content) == ("abc", "defghijkl")


def test_streamed_reasoning_and_content_equal_the_unstreamed_answer(server):
    """34.1 end to end: the issue's request, streamed and not, split the same way."""
    body = {"model": "tiny", "messages": MSG, "temperature": 0, "max_tokens": 30, "chat_template": OPENS_THINK,
            "structured_outputs": {"regex": "abc</think>defghijkl"}}
    whole = _post(server, "/v1/chat/completions", body)["choices"][0]["message"]
    assert _streamed(_chunks(server, "/v1/chat/completions", body)) == (whole["reasoning"] or "",
                                                                         whole["content"] or "")
    assert whole["reasoning"] or whole["content"]


def test_an_answer_without_the_end_tag_is_reasoning(tokenizer):
    """34.2: an output cut off mid-thought (no </think>) after a prompt that opened <think> is reasoning, counted in
    usage.completion_tokens_details.reasoning_tokens; it used to come back as content."""
    prompt = tokenizer.encode("Describe a quiet street.\n<think>\n", add_special_tokens=False)
    ids = tokenizer.encode("The street is calm and", add_special_tokens=False)
    text = tokenizer.decode(ids)
    out = RequestOutput("r", None, prompt, [CompletionOutput(0, text, ids, [0.0] * len(ids), "length")], True)
    answer = chat_response(_state(tokenizer), ChatCompletionRequest(messages=MSG), out, "id", 0)
    message = answer.choices[0].message
    assert (message.reasoning, message.reasoning_content, message.content) == (text, text, None)
    assert answer.usage.completion_tokens_details == {"reasoning_tokens": len(ids)}


def test_reasoning_tokens_stop_at_the_end_tag(tokenizer):
    reasoning = tokenizer.encode("one two three", add_special_tokens=False)
    rest = tokenizer.encode("</think>\n\nfour five", add_special_tokens=False)
    ids = reasoning + rest
    prompt = tokenizer.encode("Describe a quiet street.\n<think>\n", add_special_tokens=False)
    out = RequestOutput("r", None, prompt, [CompletionOutput(0, tokenizer.decode(ids), ids, [0.0] * len(ids),
                                                              "stop")], True)
    answer = chat_response(_state(tokenizer), ChatCompletionRequest(messages=MSG), out, "id", 0)
    assert answer.choices[0].message.content == "four five"
    assert answer.usage.completion_tokens_details == {"reasoning_tokens": len(reasoning)}


def test_a_cut_off_thought_end_to_end(server):
    """34.2 end to end: max_tokens cuts the thought short; it is reasoning, streamed or not."""
    body = {"model": "tiny", "messages": MSG, "temperature": 0, "max_tokens": 5, "chat_template": OPENS_THINK,
            "structured_outputs": {"regex": "abcdefghijklmnopqrstuvwxyz"}}
    answer = _post(server, "/v1/chat/completions", body)
    message, used = answer["choices"][0]["message"], answer["usage"]
    assert answer["choices"][0]["finish_reason"] == "length" and message["content"] is None and message["reasoning"]
    assert used["completion_tokens_details"] == {"reasoning_tokens": used["completion_tokens"]}
    chunks = _chunks(server, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert _streamed(chunks) == (message["reasoning"], "")
    assert chunks[-1]["usage"]["completion_tokens_details"] == used["completion_tokens_details"]


def test_completion_streams_carry_the_prompt_ids_first(server):
    """34.9: with return_token_ids, each choice's first chunk has prompt_token_ids (vLLM); they were never sent."""
    body = {"model": "tiny", "prompt": "A quiet street", "max_tokens": 4, "temperature": 0, "n": 2,
            "return_token_ids": True}
    whole = _post(server, "/v1/completions", body)
    chunks = _chunks(server, "/v1/completions", body)
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == index]
        assert mine[0]["prompt_token_ids"] == whole["choices"][index]["prompt_token_ids"]
        assert all(c["prompt_token_ids"] is None for c in mine[1:])  # vLLM: the key on every chunk, null after
        assert [t for c in mine for t in c["token_ids"]] == whole["choices"][index]["token_ids"]


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": MSG}),
    ("/v1/completions", {"prompt": "A quiet street"}),
])
def test_one_choice_per_chunk_with_the_required_keys(server, path, body):
    """34.10: n > 1 put several choices in one chunk; 34.11: chunks left out finish_reason / logprobs when null."""
    chunks = _chunks(server, path, {"model": "tiny", "max_tokens": 4, "temperature": 0, "n": 3, **body})
    with_choices = [c for c in chunks if c["choices"]]
    assert all(len(c["choices"]) == 1 for c in with_choices)
    assert {c["choices"][0]["index"] for c in with_choices} == {0, 1, 2}
    for c in with_choices:
        choice = c["choices"][0]
        assert {"index", "finish_reason", "logprobs"} <= set(choice) and choice["logprobs"] is None
    finished = [c["choices"][0] for c in with_choices if c["choices"][0]["finish_reason"] is not None]
    assert sorted(ch["index"] for ch in finished) == [0, 1, 2] and all("stop_reason" in ch for ch in finished)


def test_asked_logprobs_are_always_in_the_chunk(server):
    chunks = _chunks(server, "/v1/chat/completions", {"model": "tiny", "messages": MSG, "max_tokens": 3,
                                                      "temperature": 0, "logprobs": True})
    assert all("logprobs" in c["choices"][0] and "finish_reason" in c["choices"][0] for c in chunks if c["choices"])
    assert any(c["choices"][0]["logprobs"] for c in chunks if c["choices"])
