"""vLLM's stop semantics over HTTP: stop-token text, min_tokens with stop strings, stop_reason of the second EOS."""

from __future__ import annotations

from typing import Any

MSGS = [{"role": "user", "content": "Describe a quiet street."}]
UN = 1376  # "Un": a plain text token the greedy answer to MSGS reaches within 24 tokens
SECOND_EOS = 3000  # <|endoftext|>: generation_config.json's second eos_token_id (the tokenizer's EOS is 3002)


def _chat(client, stream: bool = False, **kw: Any):
    return client.chat.completions.create(model="m", messages=MSGS, temperature=0, stream=stream,
                                          extra_body={"return_token_ids": True, **kw.pop("extra", {})}, **kw)


def _streamed_chat(client, **kw: Any) -> tuple[str, Any]:
    chunks = [c for c in _chat(client, stream=True, **kw) if c.choices]
    return "".join(c.choices[0].delta.content or "" for c in chunks), chunks[-1].choices[0]


def _vllm_stop_cut(decode, ids: list[int], stop: str, min_tokens: int) -> tuple[str, int] | None:
    """vLLM's rule, token by token: (text, ids kept) where `stop` first ends after the min_tokens-th token's text."""
    for k in range(min_tokens + 1, len(ids) + 1):
        before, text = len(decode(ids[:k - 1])), decode(ids[:k])
        at = text.find(stop, max(before - len(stop) + 1, 0))
        if at != -1:
            return text[:at], k
    return None


def test_stop_token_text_not_in_output(client, server):
    # catches (issue 34.4): '…messageUn' against vLLM's '…message', in chat, completions and streams
    decode = server.state.preparer.tokenizer.decode
    c = _chat(client, max_tokens=24, extra={"stop_token_ids": [UN]}).choices[0]
    ids = c.model_extra["token_ids"]
    assert ids[-1] == UN and c.finish_reason == "stop" and c.model_extra["stop_reason"] == UN, ids
    assert c.message.content == decode(ids[:-1], skip_special_tokens=True) and not c.message.content.endswith("Un")
    streamed, last = _streamed_chat(client, max_tokens=24, extra={"stop_token_ids": [UN]})
    assert streamed == c.message.content and last.finish_reason == "stop"
    kept = _chat(client, max_tokens=24, extra={"stop_token_ids": [UN], "include_stop_str_in_output": True})
    assert kept.choices[0].message.content == decode(ids, skip_special_tokens=True)
    kw = dict(model="m", prompt="Describe a quiet street.", max_tokens=24, temperature=0)
    base = client.completions.create(**kw, extra_body={"return_token_ids": True}).choices[0]
    stop_id = base.model_extra["token_ids"][3]
    assert decode([stop_id], skip_special_tokens=True), "the stop token must have text for this check"
    cut = client.completions.create(**kw, extra_body={"return_token_ids": True, "stop_token_ids": [stop_id]}).choices[0]
    assert cut.model_extra["token_ids"] == base.model_extra["token_ids"][:4]
    assert cut.model_extra["stop_reason"] == stop_id and cut.finish_reason == "stop"
    assert cut.text == decode(cut.model_extra["token_ids"][:-1], skip_special_tokens=True)
    pieces = client.completions.create(**kw, stream=True, extra_body={"stop_token_ids": [stop_id]})
    assert "".join(p.choices[0].text for p in pieces if p.choices) == cut.text


def test_min_tokens_hides_earlier_stop_strings(client, server):
    # catches (issue 34.5): 'example' within the first min_tokens tokens ended the request with 3 ids and 'm '
    decode = server.state.preparer.tokenizer.decode
    free = _chat(client, max_tokens=12, extra={"min_tokens": 3}).choices[0]
    ids = free.model_extra["token_ids"]
    text = free.message.content
    assert "example" in decode(ids[:3], skip_special_tokens=True), text  # the case of the issue: stop string early
    c = _chat(client, max_tokens=12, stop=["example"], extra={"min_tokens": 3}).choices[0]
    expect = _vllm_stop_cut(lambda t: decode(t, skip_special_tokens=True), ids, "example", 3)
    if expect is None:
        assert (c.message.content, c.model_extra["token_ids"], c.finish_reason) == (text, ids, free.finish_reason)
    else:
        assert (c.message.content, c.model_extra["token_ids"]) == (expect[0], ids[:expect[1]])
        assert c.finish_reason == "stop" and c.model_extra["stop_reason"] == "example"
    assert len(c.model_extra["token_ids"]) > 3
    streamed, _ = _streamed_chat(client, max_tokens=12, stop=["example"], extra={"min_tokens": 3})
    assert streamed == c.message.content


def test_second_eos_stop_reason_is_its_id(client):
    # catches (issue 34.16): the generation config's second EOS ended with stop_reason null; vLLM reports the id
    kw = dict(model="m", prompt="hi", max_tokens=4, temperature=0)
    for token, reason in ((SECOND_EOS, SECOND_EOS), (3002, None)):
        body = {"return_token_ids": True, "logit_bias": {str(token): 100}, "skip_special_tokens": False}
        c = client.completions.create(**kw, extra_body=body).choices[0]
        assert c.model_extra["token_ids"] == [token] and c.finish_reason == "stop"
        assert c.model_extra["stop_reason"] == reason and c.text == ""  # the EOS text is left out, as vLLM
        chat = _chat(client, max_tokens=4, extra={"logit_bias": {str(token): 100}}).choices[0]
        assert chat.model_extra["stop_reason"] == reason and chat.message.content == ""
