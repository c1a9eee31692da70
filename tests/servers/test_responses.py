"""POST /v1/responses through the official openai client: parity with LLM.generate, token round trips, items."""

from __future__ import annotations

import httpx
import pytest
from server_cases import API_KEY, MEDIA, SMALL, data_url

from mm_infer import SamplingParams

EOS = 3002
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MM = {"mm_processor_kwargs": {"max_pixels": SMALL}}
PHOTO = MEDIA / "images" / "photo.png"
GRAY = MEDIA / "images" / "gray.png"


def user(text: str, image=None) -> dict:
    parts = [{"type": "input_image", "image_url": data_url(image, "image/png")}] if image else []
    return {"role": "user", "content": [*parts, {"type": "input_text", "text": text}]}


def respond(client, items, **kw):
    extra = {**MM, **kw.pop("extra_body", {})}
    return client.responses.create(model="m", input=items, temperature=0.0, max_output_tokens=kw.pop("n", 3),
                                   extra_body=extra, **kw)


def ids_of(response) -> tuple[list[int], list[int], list[float]]:
    last = response.output[-1].model_extra
    return last["prompt_token_ids"], last["generation_token_ids"], last["generation_log_probs"]


def chat_prompt_ids(client, messages) -> list[int]:
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=1, temperature=0.0,
                                       extra_body={**MM, "return_token_ids": True})
    return r.model_extra["prompt_token_ids"]


def test_greedy_response_equals_llm_generate(client, llm):
    r = respond(client, [user("What is this?", PHOTO)], n=6, instructions="Answer briefly.",
                include=["message.output_text.logprobs"], top_logprobs=2)
    ref = llm.generate({"messages": [{"role": "system", "content": "Answer briefly."},
                                     {"role": "user", "content": [{"type": "image"},
                                                                  {"type": "text", "text": "What is this?"}]}],
                        "multi_modal_data": {"image": [PHOTO]}, **MM},
                       SamplingParams(temperature=0.0, max_tokens=6, logprobs=2), use_tqdm=False)[0]
    prompt, generated, logprobs = ids_of(r)
    assert prompt == ref.prompt_token_ids and generated == ref.outputs[0].token_ids
    assert logprobs == pytest.approx(ref.outputs[0].logprobs, abs=1e-5)
    text = r.output[-1].content[0]
    assert r.output_text == text.text == ref.outputs[0].text
    assert [t.logprob for t in text.logprobs] == pytest.approx(ref.outputs[0].logprobs, abs=1e-5)
    assert all(len(t.top_logprobs) == 2 for t in text.logprobs)
    assert r.usage.input_tokens == len(prompt) and r.usage.output_tokens == len(generated)
    finish = ref.outputs[0].finish_reason
    assert r.status == ("incomplete" if finish == "length" else "completed")
    assert isinstance(r.model_extra["weight_version"], int)


def test_sent_back_items_splice_the_turn_exactly(client):
    # min_tokens holds EOS back for three tokens, then the bias makes the model close its turn with EOS
    first = respond(client, [user("Describe it.", PHOTO)], n=8,
                    extra_body={"min_tokens": 3, "logit_bias": {str(EOS): 100}})
    p1, g1, _ = ids_of(first)
    assert g1[-1] == EOS and len(g1) == 4
    history = [user("Describe it.", PHOTO), *[item.model_dump(exclude_none=True) for item in first.output]]
    second = respond(client, [*history, user("And this?", GRAY)])
    p2, _, _ = ids_of(second)
    assert p2[:len(p1) + len(g1)] == p1 + g1, "the second prompt must start with the first turn's exact ids"


def test_a_later_assistant_message_without_ids_is_templated_not_spliced(client):
    first = respond(client, [user("Describe it.", PHOTO)], n=8,
                    extra_body={"min_tokens": 3, "logit_bias": {str(EOS): 100}})
    p1, g1, lp1 = ids_of(first)
    text = first.output_text
    items = [user("Describe it.", PHOTO),
             {"role": "assistant", "content": [{"type": "output_text", "text": text}], "prompt_token_ids": p1,
              "generation_token_ids": g1, "generation_log_probs": lp1},
             user("Again?"), {"role": "assistant", "content": "made up"}, user("Why?")]
    p3, _, _ = ids_of(respond(client, items, n=1))
    chat = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(PHOTO, "image/png")}},
                                         {"type": "text", "text": "Describe it."}]},
            {"role": "assistant", "content": text, "prompt_token_ids": p1, "generation_token_ids": g1},
            {"role": "user", "content": "Again?"}, {"role": "assistant", "content": "made up"},
            {"role": "user", "content": "Why?"}]
    assert p3[:len(p1) + len(g1)] == p1 + g1
    assert p3 == chat_prompt_ids(client, chat)


def test_an_empty_assistant_item_with_ids_leaks_nothing(client):
    plain = ids_of(respond(client, [user("a"), user("b")], n=1))[0]
    leaked = [9, 9, 9, 9]
    items = [user("a"), {"role": "assistant", "content": [{"type": "output_text", "text": ""}],
                         "prompt_token_ids": leaked, "generation_token_ids": leaked}, user("b")]
    prompt = ids_of(respond(client, items, n=1))[0]
    assert prompt == plain and prompt[:4] != leaked


def test_function_call_and_reasoning_items_render_like_chat(client):
    tools = [{"type": "function", "name": "lookup", "description": "d",
              "parameters": {"type": "object", "properties": {}}}]
    items = [user("look it up"), {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
             {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{\"q\": 1}"},
             {"type": "function_call_output", "call_id": "call_1", "output": "42"}]
    r = respond(client, items, n=2, tools=tools)
    chat = client.chat.completions.create(
        model="m", max_tokens=2, temperature=0.0, extra_body={**MM, "return_token_ids": True},
        tools=[{"type": "function", "function": {k: v for k, v in tools[0].items() if k != "type"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "look it up"}]},
                  {"role": "assistant", "content": None, "reasoning_content": "hmm", "tool_calls": [
                      {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": 1}"}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "42"}])
    assert ids_of(r)[0] == chat.model_extra["prompt_token_ids"]
    assert ids_of(r)[1] == chat.choices[0].model_extra["token_ids"]
    assert r.tools[0].name == "lookup"


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format"),
    ({"input": "x", "surprise": 1}, "surprise"),
    ({"input": [{"role": "user", "content": "a", "prompt_token_ids": [1], "generation_token_ids": [2]}]}, "input[0]"),
    ({"input": []}, "input"),
])
def test_unsupported_fields_are_400(server, body, param):
    r = httpx.post(f"{server.base_url}/v1/responses", json={"model": "m", **body}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_input_video_renders_like_chat(client):
    url = data_url(MEDIA / "videos" / "odd7_h264_2fps.mp4", "video/mp4")
    kw = {"mm_processor_kwargs": {"video_max_pixels": SMALL, "max_pixels": SMALL}}
    r = respond(client, [{"role": "user", "content": [{"type": "input_video", "video_url": url},
                                                      {"type": "input_text", "text": "what happens?"}]}],
                n=2, extra_body=kw)
    chat = client.chat.completions.create(
        model="m", max_tokens=2, temperature=0.0, extra_body={**kw, "return_token_ids": True},
        messages=[{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                               {"type": "text", "text": "what happens?"}]}])
    prompt, generated, _ = ids_of(r)
    assert prompt.count(3007) > 1  # the video placeholder is expanded
    assert prompt == chat.model_extra["prompt_token_ids"] and generated == chat.choices[0].model_extra["token_ids"]
