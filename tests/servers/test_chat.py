"""Chat completions through the official openai client: media sources, streaming, n>1, parity with LLM.generate."""

from __future__ import annotations

import math

import pytest
from server_cases import MEDIA, SMALL, data_url

from mm_infer import SamplingParams

IMAGE_PAD, VIDEO_PAD = 3006, 3007
MODEL = "tiny-qwen2-vl"


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def ask(client, content, **kw):
    extra = {"mm_processor_kwargs": {"max_pixels": SMALL}, **kw.pop("extra_body", {})}
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          max_tokens=kw.pop("max_tokens", 4), temperature=kw.pop("temperature", 0.0),
                                          extra_body=extra, **kw)


def test_data_url_image_matches_llm_generate(client, llm, photo_url):
    """Greedy ids, per-token logprobs and expanded prompt ids equal the offline LLM for the same request."""
    r = ask(client, [image_part(photo_url), {"type": "text", "text": "What is this?"}], max_tokens=6,
            logprobs=True, top_logprobs=3, extra_body={"return_token_ids": True})
    ref = llm.generate({"messages": [{"role": "user", "content": [{"type": "image"},
                                                                   {"type": "text", "text": "What is this?"}]}],
                        "multi_modal_data": {"image": [MEDIA / "images" / "photo.png"]},
                        "mm_processor_kwargs": {"max_pixels": SMALL}},
                       SamplingParams(temperature=0.0, max_tokens=6, logprobs=3), use_tqdm=False)[0]
    choice = r.choices[0]
    body = r.model_extra
    assert body["prompt_token_ids"] == ref.prompt_token_ids
    assert IMAGE_PAD in body["prompt_token_ids"]
    assert choice.model_extra["token_ids"] == ref.outputs[0].token_ids
    assert choice.message.model_extra["generation_token_ids"] == ref.outputs[0].token_ids
    assert choice.message.model_extra["prompt_token_ids"] == ref.prompt_token_ids
    lps = [t.logprob for t in choice.logprobs.content]
    assert len(lps) == 6
    assert max(abs(a - b) for a, b in zip(lps, ref.outputs[0].logprobs, strict=True)) < 1e-5
    assert choice.message.model_extra["generation_log_probs"] == pytest.approx(ref.outputs[0].logprobs, abs=1e-5)
    for tok in choice.logprobs.content:
        assert len(tok.top_logprobs) == 3
        assert tok.top_logprobs[0].logprob >= tok.top_logprobs[-1].logprob
        assert tok.logprob <= tok.top_logprobs[0].logprob + 1e-6
    assert choice.message.content == ref.outputs[0].text
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids) and r.usage.completion_tokens == 6


def test_tokens_as_token_ids(client, photo_url):
    r = ask(client, "hello", logprobs=True, top_logprobs=1,
            extra_body={"return_tokens_as_token_ids": True, "return_token_ids": True})
    content = r.choices[0].logprobs.content
    assert [t.token for t in content] == [f"token_id:{i}" for i in r.choices[0].model_extra["token_ids"]]


def test_file_url_under_allowed_path_equals_data_url(client, photo_url):
    path = MEDIA / "images" / "photo.png"
    by_file = ask(client, [image_part(f"file://{path}"), {"type": "text", "text": "x"}],
                  extra_body={"return_token_ids": True})
    by_data = ask(client, [image_part(photo_url), {"type": "text", "text": "x"}], extra_body={"return_token_ids": True})
    assert by_file.model_extra["prompt_token_ids"] == by_data.model_extra["prompt_token_ids"]
    assert by_file.choices[0].model_extra["token_ids"] == by_data.choices[0].model_extra["token_ids"]


def test_several_images_and_input_image_parts(client, photo_url):
    gray = data_url(MEDIA / "images" / "gray.png", "image/png")
    r = ask(client, [image_part(photo_url), {"type": "input_image", "image_url": gray, "detail": "low"},
                     {"type": "image_url", "image_url": gray}, {"type": "input_text", "text": "compare"}],
            extra_body={"return_token_ids": True})
    ids = r.model_extra["prompt_token_ids"]
    runs = sum(1 for a, b in zip(ids, ids[1:], strict=False) if b == IMAGE_PAD and a != IMAGE_PAD)
    assert runs == 3
    assert ids.count(IMAGE_PAD) > 2  # expanded, not one pad per image


def test_video_url_and_input_video(client):
    url = data_url(MEDIA / "videos" / "odd7_h264_2fps.mp4", "video/mp4")
    kw = {"video_max_pixels": SMALL, "max_pixels": SMALL}
    for part in ({"type": "video_url", "video_url": {"url": url}}, {"type": "input_video", "video_url": url}):
        r = ask(client, [part, {"type": "text", "text": "what happens?"}],
                extra_body={"return_token_ids": True, "mm_processor_kwargs": kw})
        assert r.model_extra["prompt_token_ids"].count(VIDEO_PAD) > 1
        assert r.choices[0].finish_reason in ("stop", "length")


def test_uuid_reuses_cached_media(client, server, photo_url):
    first = ask(client, [{"type": "image_url", "image_url": {"url": photo_url}, "uuid": "cat-1"},
                         {"type": "text", "text": "a"}], extra_body={"return_token_ids": True})
    hits = server.state.media.uuid_hits
    again = ask(client, [{"type": "image_url", "uuid": "cat-1"}, {"type": "text", "text": "a"}],
                extra_body={"return_token_ids": True})
    assert server.state.media.uuid_hits == hits + 1
    assert again.model_extra["prompt_token_ids"] == first.model_extra["prompt_token_ids"]


def test_streaming_equals_non_streaming(client, photo_url):
    content = [image_part(photo_url), {"type": "text", "text": "stream"}]
    whole = ask(client, content, max_tokens=6, extra_body={"return_token_ids": True})
    chunks = list(ask(client, content, max_tokens=6, stream=True, stream_options={"include_usage": True},
                      extra_body={"return_token_ids": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ids = [t for c in chunks if c.choices for t in (c.choices[0].model_extra.get("token_ids") or [])]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text == whole.choices[0].message.content
    assert ids == whole.choices[0].model_extra["token_ids"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == 6


def test_n4_seeded_samples(client, photo_url):
    r = ask(client, [image_part(photo_url), {"type": "text", "text": "n"}], n=4, temperature=1.0, seed=7,
            max_tokens=5, logprobs=True)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    assert r.usage.completion_tokens == 20
    seqs = {tuple(c.message.model_extra["generation_token_ids"]) for c in r.choices}
    assert len(seqs) > 1, "four samples at temperature 1 should not all agree"
    again = ask(client, [image_part(photo_url), {"type": "text", "text": "n"}], n=4, temperature=1.0, seed=7,
                max_tokens=5)
    assert [c.message.model_extra["generation_token_ids"] for c in again.choices] == \
        [c.message.model_extra["generation_token_ids"] for c in r.choices]
    for c in r.choices:
        assert all(math.isfinite(t.logprob) and t.logprob <= 0 for t in c.logprobs.content)


def test_n2_streaming_has_both_choices(client):
    chunks = list(ask(client, "hi", n=2, max_tokens=3, stream=True, temperature=1.0, seed=1))
    finished = {ch.index for c in chunks for ch in c.choices if ch.finish_reason}
    assert finished == {0, 1}


def test_prompt_logprobs_and_max_tokens_clamped(client):
    r = ask(client, "clamp me", max_tokens=100000, logit_bias={"3002": 100}, extra_body={"prompt_logprobs": 0})
    assert r.choices[0].finish_reason == "stop"
    plp = r.model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == r.usage.prompt_tokens
    assert all(v is not None and next(iter(v.values()))["logprob"] <= 0 for v in plp[1:])


def test_tools_and_tool_history_are_accepted(client):
    tools = [{"type": "function", "function": {"name": "lookup", "description": "d",
                                               "parameters": {"type": "object", "properties": {}}}}]
    messages = [{"role": "user", "content": "look it up"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": 1}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    for choice in ("auto", "none"):
        r = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, tool_choice=choice,
                                           max_tokens=2, temperature=0.0)
        assert r.choices[0].finish_reason in ("stop", "length") and r.usage.prompt_tokens > 10


def test_concurrent_requests_do_not_mix(server, llm):
    import asyncio

    import openai
    from server_cases import API_KEY

    images = ["photo.png", "gray.png", "rgba.png", "la.png", "photo_q90.jpg", "cmyk.jpg"]
    mime = {".png": "image/png", ".jpg": "image/jpeg"}

    async def run() -> list:
        client = openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)
        calls = [client.chat.completions.create(
            model=MODEL, max_tokens=5, temperature=0.0, messages=[{"role": "user", "content": [
                image_part(data_url(MEDIA / "images" / name, mime[name[-4:]])), {"type": "text", "text": name}]}],
            extra_body={"return_token_ids": True, "mm_processor_kwargs": {"max_pixels": SMALL}}) for name in images]
        try:
            return await asyncio.gather(*calls)
        finally:
            await client.close()

    results = asyncio.run(run())
    refs = llm.generate([{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": n}]}],
                          "multi_modal_data": {"image": [MEDIA / "images" / n]},
                          "mm_processor_kwargs": {"max_pixels": SMALL}} for n in images],
                        SamplingParams(temperature=0.0, max_tokens=5), use_tqdm=False)
    for r, ref in zip(results, refs, strict=True):
        assert r.model_extra["prompt_token_ids"] == ref.prompt_token_ids
        assert r.choices[0].model_extra["token_ids"] == ref.outputs[0].token_ids
