"""The OpenAI server on the hybrid tiny models (Nemotron Omni's Mamba-2; Qwen3.5's gated DeltaNet, dense and MoE):
image and video chat (the official client, logprobs), /tokenize, /v1/responses, render -> generate and multi-turn
splicing, each equal to the offline LLM on the same checkpoint; expanded runs checked, never expanded twice; a JSON
schema and a forced tool call give valid output."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import torch
from server_cases import MEDIA, REPO, data_url

from mm_infer import LLM, SamplingParams


@dataclass(frozen=True)
class Family:
    """A tiny checkpoint and the ids its media runs are written with."""

    path: Path
    start: int  # the token before each run: <img> / <|vision_start|>
    end: int  # </img> / <|vision_end|>
    image: int  # the pad of image runs
    video: int  # the pad of video runs (Nemotron Omni fills videos with <image> too)


MODELS = {"nemotron-omni": Family(REPO / "assets" / "models" / "tiny-nemotron-omni", 3004, 3005, 3003, 3003),
          "qwen3.5": Family(REPO / "assets" / "models" / "tiny-qwen3.5", 3003, 3004, 3006, 3007),
          "qwen3.5-moe": Family(REPO / "assets" / "models" / "tiny-qwen3.5-moe", 3003, 3004, 3006, 3007)}
KEY = "k"
AUTH = {"Authorization": f"Bearer {KEY}"}
EOS = 3002  # <|im_end|> in both tokenizers
OMNI_LABEL = re.compile(r"Frame \d+ sampled at \d+\.\d\d seconds"
                        r"(?: and frame \d+ sampled at \d+\.\d\d seconds)?: <img>")
OPTIONS = {"num_kv_blocks": 256, "max_model_len": 2048, "batch_invariant": True, "cpu_threads": 1}
PHOTO, GRAY = MEDIA / "images" / "photo.png", MEDIA / "images" / "gray.png"
CLIP = MEDIA / "videos" / "odd7_h264_2fps.mp4"  # 7 frames at 2 fps: sampled to 8, 4 temporal slots
MIME = {".png": "image/png", ".jpg": "image/jpeg", ".mp4": "video/mp4"}
SCHEMA = {"type": "object", "properties": {"color": {"enum": ["red", "green"]}, "ok": {"type": "boolean"}},
          "required": ["color", "ok"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}]


@pytest.fixture(scope="module", params=sorted(MODELS))
def hybrid(request) -> Iterator[tuple[openai.OpenAI, str, LLM, Family]]:
    from servers.openai.config import ServerConfig
    from servers.openai.launch import BackgroundServer, free_port

    family = MODELS[request.param]
    model = family.path
    threads = torch.get_num_threads()
    srv = BackgroundServer(ServerConfig(model_dir=str(model), port=free_port(), api_key=KEY, max_body_bytes=4 << 20,
                                        extra_served_names=("m",), tool_parser="hermes",
                                        engine_options=OPTIONS)).start()
    client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)
    yield client, srv.base_url, LLM(str(model), **OPTIONS), family
    assert srv.state.metrics.running == 0, "a request was never closed"
    srv.stop()
    torch.set_num_threads(threads)


def part(path: Path) -> dict:
    kind = "video_url" if path.suffix == ".mp4" else "image_url"
    return {"type": kind, kind: {"url": data_url(path, MIME[path.suffix])}}


def llm_prompt(media: list[Path], text: str) -> dict:
    """The same chat for the offline LLM: bare parts in order, the files as multi_modal_data."""
    kinds = ["video" if p.suffix == ".mp4" else "image" for p in media]
    content = [*({"type": k} for k in kinds), {"type": "text", "text": text}]
    mm: dict[str, list[Path]] = {}
    for k, p in zip(kinds, media, strict=True):
        mm.setdefault(k, []).append(p)
    return {"messages": [{"role": "user", "content": content}], "multi_modal_data": mm}


def _post(base_url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{base_url}{path}", json=body, headers=AUTH, timeout=120)


def _chat_equals_llm(hybrid, media: list[Path], text: str):
    client, _, llm, _ = hybrid
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": [*map(part, media),
                                                                                         {"type": "text",
                                                                                          "text": text}]}],
                                       temperature=0.0, max_tokens=6, logprobs=True, top_logprobs=2,
                                       extra_body={"return_token_ids": True})
    ref = llm.generate(llm_prompt(media, text), SamplingParams(temperature=0.0, max_tokens=6, logprobs=2),
                       use_tqdm=False)[0]
    choice = r.choices[0]
    assert r.model_extra["prompt_token_ids"] == ref.prompt_token_ids
    assert choice.model_extra["token_ids"] == ref.outputs[0].token_ids and len(ref.outputs[0].token_ids) == 6
    assert choice.message.content == ref.outputs[0].text
    got = [t.logprob for t in choice.logprobs.content]
    assert max(abs(a - b) for a, b in zip(got, ref.outputs[0].logprobs, strict=True)) <= 1e-5
    assert [len(t.top_logprobs) for t in choice.logprobs.content] == [2] * 6
    return ref


def test_chat_with_an_image_equals_llm(hybrid):
    f = hybrid[3]
    ids = _chat_equals_llm(hybrid, [PHOTO], "What is it?").prompt_token_ids
    start = ids.index(f.start)
    n = 60 if f.image == f.video else 187  # Omni: 12 x 20 patches; Qwen3.5: 22 x 34; merged 2 x 2
    assert ids[start + 1:start + 1 + n] == [f.image] * n and ids[start + 1 + n] == f.end


def test_chat_with_a_video_equals_llm(hybrid):
    f = hybrid[3]
    ref = _chat_equals_llm(hybrid, [CLIP], "What moves?")
    text = hybrid[2].get_tokenizer().decode(ref.prompt_token_ids)
    if f.image == f.video:  # Omni: HF's frame labels before each tubelet, the padded frame unnamed
        labels = OMNI_LABEL.findall(text)
        assert len(labels) == 4 and labels[-1] == "Frame 7 sampled at 3.00 seconds: <img>"
        assert ref.prompt_token_ids.count(f.image) == 4 * 12
    else:  # Qwen3.5: one timestamped run per temporal slot
        assert text.count("seconds><|vision_start|>") == 4
        assert ref.prompt_token_ids.count(f.video) == 4 * 80 and f.image not in ref.prompt_token_ids


def test_tokenize_equals_the_preparer(hybrid):
    _, base_url, llm, f = hybrid
    body = {"messages": [{"role": "user", "content": [part(GRAY), part(CLIP), {"type": "text", "text": "Both?"}]}]}
    r = _post(base_url, "/tokenize", body)
    assert r.status_code == 200, r.text
    ids, ranges = r.json()["tokens"], r.json()["placeholders"]
    assert ids == llm.engine.prepare(llm_prompt([GRAY, CLIP], "Both?")).prompt_token_ids
    assert r.json()["count"] == len(ids)
    assert [p["modality"] for p in ranges] == ["image"] + ["video"] * 4  # one range per temporal slot
    for p in ranges:
        at, n = p["offset"], p["length"]
        pad = f.image if p["modality"] == "image" else f.video
        assert ids[at - 1] == f.start and ids[at:at + n] == [pad] * n and ids[at + n] == f.end
    assert sum(p["length"] for p in ranges) == len([i for i in ids if i in (f.image, f.video)])


def test_responses_with_an_image_equals_llm(hybrid):
    client, _, llm, f = hybrid
    jpg = MEDIA / "images" / "photo_q90.jpg"
    items = [{"role": "user", "content": [{"type": "input_image", "image_url": data_url(jpg, "image/jpeg")},
                                          {"type": "input_text", "text": "Colour?"}]}]
    r = client.responses.create(model="m", input=items, instructions="Answer briefly.", temperature=0.0,
                                max_output_tokens=5)
    prompt = llm_prompt([jpg], "Colour?")
    prompt["messages"].insert(0, {"role": "system", "content": "Answer briefly."})
    ref = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=5, logprobs=0), use_tqdm=False)[0]
    last = r.output[-1].model_extra
    assert last["prompt_token_ids"] == ref.prompt_token_ids and ref.prompt_token_ids.count(f.image) > 0
    assert last["generation_token_ids"] == ref.outputs[0].token_ids
    assert max(abs(a - b) for a, b in zip(last["generation_log_probs"], ref.outputs[0].logprobs, strict=True)) <= 1e-5
    assert r.output_text == ref.outputs[0].text


@pytest.mark.parametrize("payload", [None, "tensors"], ids=["by-reference", "inline"])
def test_render_then_generate_equals_chat(hybrid, payload):
    _, base_url, _, _ = hybrid
    body = {"model": "m", "max_tokens": 5, "temperature": 0.0, "logprobs": True, "return_token_ids": True,
            "messages": [{"role": "user", "content": [part(PHOTO), part(CLIP), {"type": "text", "text": "x"}]}]}
    chat = _post(base_url, "/v1/chat/completions", body).json()
    rendered = _post(base_url, "/v1/chat/completions/render", {**body, "mm_payload": payload})
    assert rendered.status_code == 200, rendered.text
    assert rendered.json()["token_ids"] == chat["prompt_token_ids"]
    gen = _post(base_url, "/inference/v1/generate", rendered.json())
    assert gen.status_code == 200, gen.text
    (choice,) = gen.json()["choices"]
    assert choice["token_ids"] == chat["choices"][0]["token_ids"]
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == chat["choices"][0]["message"][
        "generation_log_probs"]


def test_generate_refuses_ids_that_do_not_match_their_features(hybrid):
    # catches: an expanded run one token short accepted (and so re-expanded or misaligned with its features)
    _, base_url, _, f = hybrid
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [part(PHOTO)]}]}
    rendered = _post(base_url, "/v1/chat/completions/render", body).json()
    ids = rendered["token_ids"]
    del ids[ids.index(f.image)]
    r = _post(base_url, "/inference/v1/generate", rendered)
    assert r.status_code == 400 and "image 0" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("first, then", [(PHOTO, CLIP), (CLIP, GRAY)], ids=["image-then-video", "video-then-image"])
def test_second_turn_starts_with_the_first_turns_exact_ids(hybrid, first, then):
    client, _, llm, f = hybrid
    turn1 = [part(first), {"type": "text", "text": "Describe it."}]
    # min_tokens holds EOS back for three tokens, then the bias makes the model close its turn with EOS
    one = client.chat.completions.create(model="m", messages=[{"role": "user", "content": turn1}], max_tokens=8,
                                         temperature=0.0, logit_bias={str(EOS): 100},
                                         extra_body={"min_tokens": 3, "return_token_ids": True})
    p1, g1 = one.model_extra["prompt_token_ids"], one.choices[0].model_extra["token_ids"]
    assert g1[-1] == EOS and len(g1) == 4 and one.choices[0].finish_reason == "stop"
    messages = [{"role": "user", "content": turn1},
                {"role": "assistant", "content": one.choices[0].message.content, "prompt_token_ids": p1,
                 "generation_token_ids": g1},
                {"role": "user", "content": [part(then), {"type": "text", "text": "And?"}]}]
    two = client.chat.completions.create(model="m", messages=messages, max_tokens=3, temperature=0.0,
                                         extra_body={"return_token_ids": True})
    p2 = two.model_extra["prompt_token_ids"]
    assert p2[:len(p1) + len(g1)] == p1 + g1, "the second prompt must start with the first turn's exact ids"
    new = llm.engine.prepare(llm_prompt([then], "And?")).prompt_token_ids
    for pad in {f.image, f.video}:  # the first turn's media is not expanded twice
        assert p2.count(pad) == p1.count(pad) + new.count(pad)
    # NeMo-RL's path: the expanded ids with both media, media_tokens_preexpanded: checked, kept, same answer
    media = {"image": [p for p in (first, then) if p.suffix != ".mp4"], "video": [CLIP]}
    ref = llm.generate({"prompt_token_ids": p2, "multi_modal_data": media, "media_tokens_preexpanded": True},
                       SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)[0]
    assert ref.prompt_token_ids == p2
    assert two.choices[0].model_extra["token_ids"] == ref.outputs[0].token_ids


def test_json_schema_response_format_is_valid_json(hybrid):
    # catches: the grammar's masks not applied on the hybrid model's rows (the untrained model never writes JSON)
    client = hybrid[0]
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA, "strict": True}}
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": [part(GRAY), {"type": "text", "text": "Colour?"}]}], n=2,
        max_tokens=48, temperature=1.0, seed=5, response_format=fmt,
        extra_body={"structured_outputs": {"disable_any_whitespace": True}})
    for c in r.choices:
        obj = json.loads(c.message.content)
        assert c.finish_reason == "stop" and obj["color"] in ("red", "green") and isinstance(obj["ok"], bool)


def test_a_named_tool_choice_comes_back_as_a_tool_call(hybrid):
    client = hybrid[0]
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": [part(GRAY), {"type": "text", "text": "Weather?"}]}],
        max_tokens=64, temperature=1.0, seed=5, tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        extra_body={"structured_outputs": {"disable_any_whitespace": True}})
    c = r.choices[0]
    assert c.finish_reason == "stop" and len(c.message.tool_calls) == 1 and c.message.content == "", c.message
    call = c.message.tool_calls[0].function
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Rome")
