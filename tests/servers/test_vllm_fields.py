"""vLLM's request surface: every field accepted, the honoured ones honoured, the others a 400 naming them."""

from __future__ import annotations

import json

import httpx
import pytest
from server_cases import API_KEY, SMALL

from mm_infer.engine.outputs.request_output import CompletionOutput, RequestOutput
from mm_infer.prompt.templating import ChatRenderer
from servers.openai.bodies.requests import ChatCompletionRequest
from servers.openai.endpoints.chat import _delta, _Sent, chat_response

AUTH = {"Authorization": f"Bearer {API_KEY}"}
USER = [{"role": "user", "content": "hi"}]
# every vLLM-only field at a value that changes nothing: all must be accepted
NEUTRAL = {"use_beam_search": False, "length_penalty": 1.0, "spaces_between_special_tokens": True,
           "truncate_prompt_tokens": None, "allowed_token_ids": None, "priority": 0, "logits_processors": None,
           "cache_salt": None, "kv_transfer_params": None, "vllm_xargs": {"plugin_arg": 1},
           "max_repetition_pattern_size": 0, "min_repetition_pattern_size": 0, "repetition_min_count": 0,
           "prompt_logprobs": None, "return_tokens_as_token_ids": False, "return_token_ids": False,
           "request_id": "req-1", "skip_special_tokens": True, "include_stop_str_in_output": False,
           "ignore_eos": False, "min_tokens": 0, "stop_token_ids": [], "top_k": -1, "min_p": 0.0,
           "repetition_penalty": 1.0, "user": "u", "seed": 1}
CHAT_ONLY = {"bad_words": [], "echo": False, "add_special_tokens": False, "documents": None, "chat_template": None,
             "reasoning_effort": None, "include_reasoning": True, "parallel_tool_calls": True,
             "add_generation_prompt": True, "continue_final_message": False, "chat_template_kwargs": {},
             "mm_processor_kwargs": {}, "max_completion_tokens": 2, "logprobs": False, "top_logprobs": 0}
COMPLETION_ONLY = {"echo": False, "suffix": None, "prompt_embeds": None, "add_special_tokens": True}


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers=AUTH, timeout=120)


def chat(server, **kw) -> httpx.Response:
    return post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 2, "temperature": 0, **kw})


def complete(server, **kw) -> httpx.Response:
    return post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "temperature": 0, **kw})


def bad(r: httpx.Response, field: str, words: str = "not supported by this server") -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and words in err["message"], err


def test_every_vllm_field_is_accepted_at_a_neutral_value(server):
    r = chat(server, **NEUTRAL, **CHAT_ONLY)
    assert r.status_code == 200, r.text
    r = complete(server, **NEUTRAL, **COMPLETION_ONLY)
    assert r.status_code == 200, r.text
    r = post(server, "/v1/responses", {"input": "hi", "max_output_tokens": 2, "priority": 0, "cache_salt": "s",
                                       "service_tier": "auto", "truncation": "auto", "max_tool_calls": 1,
                                       "enable_response_messages": False, "reasoning": {"effort": "low"}})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("field,value", [
    ("use_beam_search", True), ("allowed_token_ids", [1, 2]), ("priority", 1), ("logits_processors", ["a.b"]),
    ("kv_transfer_params", {"do_remote_decode": True}), ("max_repetition_pattern_size", 4),
    ("min_repetition_pattern_size", 2), ("repetition_min_count", 3)])
def test_unhonoured_values_are_400_naming_the_field(server, field, value):
    bad(chat(server, **{field: value}), field)
    bad(complete(server, **{field: value}), field)


@pytest.mark.parametrize("path,field,value", [
    ("/v1/chat/completions", "bad_words", ["hello"]), ("/v1/completions", "suffix", "tail"),
    ("/v1/completions", "prompt_embeds", "AAAA")])
def test_endpoint_only_fields_unhonoured(server, path, field, value):
    bad(chat(server, **{field: value}) if "chat" in path else complete(server, **{field: value}), field)


def test_responses_unhonoured_fields(server):
    for field, value in (("prompt", {"id": "pmpt_1"}), ("enable_response_messages", True),
                         ("previous_input_messages", [{"role": "user", "content": "x"}])):
        r = post(server, "/v1/responses", {"input": "hi", "max_output_tokens": 2, field: value})
        bad(r, field)


def test_bad_values_and_unknown_fields(server):
    bad(chat(server, cache_salt=""), "cache_salt", "non-empty")
    bad(chat(server, truncate_prompt_tokens=0), "truncate_prompt_tokens", "at least 1")
    bad(complete(server, max_tokens=0), "max_tokens", "only with echo")
    r = chat(server, stream_options={"include_usage": True})  # vLLM: stream_options only with stream
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream_options"
    r = chat(server, best_of=2)  # vLLM takes best_of and ignores it; more than one sample per choice is refused
    assert r.status_code == 400 and r.json()["error"]["param"] == "best_of"
    assert chat(server, best_of=1).status_code == 200  # one sample per choice: what it means without best_of


def test_spaces_between_special_tokens_changes_nothing(server):
    """Byte-level BPE puts no space between special tokens, so both values give vLLM's text."""
    body = {"max_tokens": 3, "skip_special_tokens": False, "ignore_eos": True, "logit_bias": {"3003": 100}}
    texts = [complete(server, **body, spaces_between_special_tokens=v).json()["choices"][0]["text"]
             for v in (True, False)]
    assert texts == ["<|vision_start|>" * 3] * 2  # three special tokens in a row, no spaces either way


def test_truncate_prompt_tokens_keeps_the_last_tokens(server):
    ids = list(range(100, 130))
    r = complete(server, prompt=ids, truncate_prompt_tokens=5, return_token_ids=True)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["prompt_token_ids"] == ids[-5:] and r.json()["usage"]["prompt_tokens"] == 5
    r = complete(server, prompt=ids, truncate_prompt_tokens=-1, return_token_ids=True)  # -1: max_model_len
    assert r.json()["choices"][0]["prompt_token_ids"] == ids


def test_truncate_prompt_tokens_never_cuts_media(server, photo_url):
    content = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": photo_url}},
               {"type": "text", "text": "now"}]
    base = {"messages": [{"role": "user", "content": content}], "max_tokens": 2, "temperature": 0,
            "return_token_ids": True, "mm_processor_kwargs": {"max_pixels": SMALL}}
    whole = post(server, "/v1/chat/completions", base).json()["prompt_token_ids"]
    r = post(server, "/v1/chat/completions", {**base, "truncate_prompt_tokens": len(whole) - 3})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_token_ids"] == whole[3:]  # text before the image went
    start = whole.index(3006)  # first image pad: its <|vision_start|> is just before
    bad(post(server, "/v1/chat/completions", {**base, "truncate_prompt_tokens": len(whole) - start}),
        "truncate_prompt_tokens", "would cut the image placeholder run")


def test_per_request_chat_template_documents_and_reasoning_effort(server):
    tok = server.state.preparer.tokenizer
    template = ("{{ reasoning_effort }}|{% for d in documents or [] %}[{{ d.title }}]{% endfor %}"
                "{% for m in messages %}<{{ m.role }}:{{ m.content }}>{% endfor %}")
    r = chat(server, chat_template=template, reasoning_effort="high", documents=[{"title": "T", "text": "x"}],
             return_token_ids=True)
    assert r.status_code == 200, r.text
    assert r.json()["prompt_token_ids"] == tok.encode("high|[T]<user:hi>", add_special_tokens=False)
    default = chat(server, return_token_ids=True).json()["prompt_token_ids"]
    assert default != r.json()["prompt_token_ids"]  # the checkpoint's template otherwise
    bad(chat(server, chat_template="{% for m in messages %}"), "chat_template", "chat template failed")
    r = post(server, "/tokenize", {"messages": USER, "chat_template": "{{ messages[0].content }}!"})
    assert r.json()["tokens"] == tok.encode("hi!", add_special_tokens=False)


def test_reasoning_sent_back_under_either_name(server):
    template = "{% for m in messages %}{{ m.reasoning_content }}|{{ m.reasoning }};{% endfor %}"
    tok = server.state.preparer.tokenizer
    for key in ("reasoning", "reasoning_content"):
        msgs = [*USER, {"role": "assistant", "content": "a", key: "why"}, *USER]
        r = chat(server, messages=msgs, chat_template=template, return_token_ids=True)
        assert r.json()["prompt_token_ids"] == tok.encode("|;why|why;|;", add_special_tokens=False), key
    msgs = [*USER, {"role": "assistant", "content": "a", "reasoning": "x", "reasoning_content": "y"}]
    bad(chat(server, messages=msgs), "messages[1].reasoning", "differ")


def _output(text: str) -> RequestOutput:
    return RequestOutput("r", None, [1, 2], [CompletionOutput(0, text, [5, 6], [-0.1, -0.2], "stop")], True)


def test_answers_carry_reasoning_under_both_names(server):
    req = ChatCompletionRequest(messages=USER)
    msg = chat_response(server.state, req, _output("<think>why</think>answer"), "id", 0).choices[0].message
    assert (msg.reasoning, msg.reasoning_content, msg.content) == ("why", "why", "answer")
    delta = _delta(server.state, req, _output("<think>why</think>answer").outputs[0], _Sent())["delta"]
    assert delta == {"reasoning": "why", "content": "answer"}  # vLLM 0.32's deltas carry no reasoning_content
    hidden = ChatCompletionRequest(messages=USER, include_reasoning=False)
    msg = chat_response(server.state, hidden, _output("<think>why</think>answer"), "id", 0).choices[0].message
    assert (msg.reasoning, msg.reasoning_content, msg.content) == (None, None, "answer")


def test_parallel_tool_calls_false_keeps_the_first_call(server):
    call = '<tool_call>{{"name": "{}", "arguments": {{}}}}</tool_call>'
    tools = [{"type": "function", "function": {"name": n}} for n in ("f", "g")]
    text = call.format("f") + call.format("g")
    both = ChatCompletionRequest(messages=USER, tools=tools)
    one = ChatCompletionRequest(messages=USER, tools=tools, parallel_tool_calls=False)
    names = [[c.function.name for c in chat_response(server.state, r, _output(text), "id", 0).choices[0]
              .message.tool_calls] for r in (both, one)]
    assert names == [["f", "g"], ["f"]]


def test_chat_echo_prepends_the_last_message(server):
    msgs = [*USER, {"role": "assistant", "content": "The answer is"}]
    r = chat(server, messages=msgs, echo=True, add_generation_prompt=False, continue_final_message=True)
    plain = chat(server, messages=msgs, add_generation_prompt=False, continue_final_message=True)
    assert r.json()["choices"][0]["message"]["content"] == "The answer is" + plain.json()["choices"][0]["message"][
        "content"]
    assert chat(server, echo=True).json()["choices"][0]["message"]["content"] == chat(server).json()["choices"][0][
        "message"]["content"]  # the last message is the user's, not the answer's role: nothing echoed


def test_completion_echo_with_return_token_ids_gives_the_prompt_as_ids_not_text(server):
    # vLLM 0.32: echo with return_token_ids answers the prompt as prompt_token_ids and echoes no text; the echoed
    # prompt's logprobs stay. Catches echoing the text twice over (ids and text)
    body = {"prompt": "hello", "echo": True, "max_tokens": 3, "logprobs": 0, "ignore_eos": True}
    with_ids = complete(server, **body, return_token_ids=True).json()["choices"][0]
    text = complete(server, **body).json()["choices"][0]
    assert text["text"].startswith("hello") and with_ids["text"] == text["text"][len("hello"):]
    assert with_ids["prompt_token_ids"] and with_ids["logprobs"]["tokens"] == text["logprobs"]["tokens"]
    with httpx.stream("POST", f"{server.base_url}/v1/completions", headers=AUTH, timeout=120,
                      json={**body, "temperature": 0, "stream": True, "return_token_ids": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == with_ids["text"]


def test_completion_echo(server):
    ids = [100, 200, 300, 400]
    tok = server.state.preparer.tokenizer
    only = complete(server, prompt=ids, echo=True, max_tokens=0, logprobs=1).json()["choices"][0]
    # id 100 alone is a partial UTF-8 byte: the text shows U+FFFD, its logprob token "" (vLLM's rule)
    assert tok.decode([100]) == "\ufffd" and only["text"] == tok.decode(ids)
    assert only["logprobs"]["tokens"] == ["", *[tok.decode([t]) for t in ids[1:]]]
    assert only["logprobs"]["token_logprobs"][0] is None and only["logprobs"]["top_logprobs"][0] is None
    assert all(lp <= 0 for lp in only["logprobs"]["token_logprobs"][1:])
    both = complete(server, prompt="hello", echo=True, max_tokens=3, logprobs=0, ignore_eos=True).json()["choices"][0]
    plain = complete(server, prompt="hello", max_tokens=3, logprobs=0, ignore_eos=True).json()["choices"][0]
    assert both["text"] == "hello" + plain["text"]
    assert both["logprobs"]["token_logprobs"][-3:] == plain["logprobs"]["token_logprobs"]
    offsets = both["logprobs"]["text_offset"]
    assert offsets == sorted(offsets) and offsets[-3] == len("".join(both["logprobs"]["tokens"][:-3]))
    with httpx.stream("POST", f"{server.base_url}/v1/completions", headers=AUTH, timeout=120,
                      json={"prompt": "hello", "echo": True, "max_tokens": 3, "ignore_eos": True, "temperature": 0,
                            "stream": True}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == both["text"]


def test_cache_salt_separates_prefix_caches(server):
    messages = [{"role": "user", "content": " ".join(f"salted{i}" for i in range(60))}]  # several full KV blocks

    def cached(salt: str | None) -> int:
        body = {"messages": messages, "max_tokens": 1} | ({"cache_salt": salt} if salt else {})
        return post(server, "/v1/chat/completions", body).json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("salt-a") == 0  # not even the template's system prefix, cached unsalted by earlier requests
    hit = cached("salt-a")
    assert hit >= 64  # the same salt shares the blocks
    assert cached("salt-b") == 0  # another salt does not
    assert cached(None) < hit  # nor does no salt (only the unsalted system prefix of other requests)


def test_continuous_usage_stats_on_every_chunk(server):
    for path, body in (("/v1/chat/completions", {"messages": USER}), ("/v1/completions", {"prompt": "hi"})):
        opts = {"include_usage": True, "continuous_usage_stats": True}
        with httpx.stream("POST", f"{server.base_url}{path}", headers=AUTH, timeout=120,
                          json={**body, "max_tokens": 4, "ignore_eos": True, "stream": True,
                                "stream_options": opts}) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
        chunks = [json.loads(e) for e in events]
        assert chunks and all(c.get("usage") for c in chunks), path
        done = [c["usage"]["completion_tokens"] for c in chunks]
        assert done == sorted(done) and done[-1] == 4, path
        assert all(c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"]
                   for c in chunks)


def test_stream_options_default_to_vllm_include_usage(server):
    with httpx.stream("POST", f"{server.base_url}/v1/completions", headers=AUTH, timeout=120,
                      json={"prompt": "hi", "max_tokens": 2, "stream": True, "stream_options": {}}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    assert '"usage"' in lines[-1]  # stream_options {} asks for the usage chunk, as in vLLM


def test_ping_and_pause_mode_from_the_query(server):
    for method in ("GET", "POST"):
        assert httpx.request(method, f"{server.base_url}/ping").status_code == 200  # open, like /health
    try:
        r = httpx.post(f"{server.base_url}/pause?mode=keep", headers=AUTH, timeout=60)
        assert r.status_code == 200 and r.json()["mode"] == "keep", r.text
        r = httpx.get(f"{server.base_url}/is_paused", headers=AUTH)
        assert (r.json()["is_paused"], r.json()["mode"]) == (True, "keep")
    finally:
        httpx.post(f"{server.base_url}/resume", headers=AUTH, timeout=60)
    r = httpx.post(f"{server.base_url}/pause?mode=keep", json={"mode": "wait"}, headers=AUTH)
    bad(r, "mode", "query string")
    bad(httpx.post(f"{server.base_url}/pause?mode=later", headers=AUTH), "mode", "not one of")
    assert not httpx.get(f"{server.base_url}/is_paused", headers=AUTH).json()["is_paused"]


class _BosTokenizer:
    """A tokenizer whose special tokens are a BOS (id 1): the tiny checkpoints add none."""

    chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kw):
        return "".join(m["content"] for m in messages)

    def encode(self, text, add_special_tokens=True):
        return [1] * add_special_tokens + [ord(c) for c in text]


def test_chat_add_special_tokens_reaches_the_tokenizer():
    renderer = ChatRenderer(_BosTokenizer(), {})
    assert renderer.render([{"role": "user", "content": "ab"}]) == [97, 98]  # vLLM's chat default: none added
    assert renderer.render([{"role": "user", "content": "ab"}], add_special_tokens=True) == [1, 97, 98]
