"""The OpenAI server on tiny Qwen3-VL (dense and MoE): chat with an image and a video, /tokenize, /v1/responses and
multi-turn splicing, each equal to the offline LLM on the same checkpoint (batch_invariant: the same bits)."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from qwen3_cases import IMAGES, QWEN3, SMALL_MEDIA, VIDEOS, chat_prompt

from mm_infer import LLM, SamplingParams

KEY = "k"
AUTH = {"Authorization": f"Bearer {KEY}"}
IMAGE_PAD, VIDEO_PAD, START, END, EOS = 3006, 3007, 3003, 3004, 3002
MM = {"mm_processor_kwargs": SMALL_MEDIA}
MIME = {".png": "image/png", ".jpg": "image/jpeg", ".mp4": "video/mp4", ".webm": "video/webm"}


def url(path: Path) -> str:
    return f"data:{MIME[path.suffix]};base64,{base64.b64encode(path.read_bytes()).decode()}"


def image_part(name: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url(IMAGES / name)}}


def video_part(name: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url(VIDEOS / name)}}


@pytest.fixture(scope="module", params=sorted(QWEN3))
def served(request) -> Iterator[tuple[str, openai.OpenAI, str, LLM]]:
    from servers.openai.config import ServerConfig
    from servers.openai.launch import BackgroundServer, free_port

    threads = torch.get_num_threads()
    model = QWEN3[request.param]
    options = {"num_kv_blocks": 256, "max_model_len": 2048, "batch_invariant": True, "cpu_threads": 1}
    srv = BackgroundServer(ServerConfig(model_dir=str(model), port=free_port(), api_key=KEY, max_body_bytes=4 << 20,
                                        extra_served_names=("m",),  # requests name "m"; others are a 404
                                        engine_options=options)).start()
    client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)
    yield request.param, client, srv.base_url, LLM(str(model), **options)
    srv.stop()
    torch.set_num_threads(threads)


def _chat(client, content: list[dict], **kw):
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}],
                                          temperature=0.0, logprobs=True, top_logprobs=2,
                                          extra_body={**MM, "return_token_ids": True, **kw.pop("extra_body", {})},
                                          **({"max_tokens": 6} | kw))


def _check_against_llm(r, llm: LLM, prompt: dict, max_tokens: int = 6):
    ref = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=2),
                       use_tqdm=False)[0]
    assert r.model_extra["prompt_token_ids"] == ref.prompt_token_ids
    choice = r.choices[0]
    assert choice.model_extra["token_ids"] == ref.outputs[0].token_ids
    assert choice.message.content == ref.outputs[0].text
    assert [t.logprob for t in choice.logprobs.content] == ref.outputs[0].logprobs
    assert [len(t.top_logprobs) for t in choice.logprobs.content] == [2] * len(ref.outputs[0].token_ids)
    return ref


def test_chat_with_an_image_equals_llm(served):
    kind, client, _, llm = served
    r = _chat(client, [image_part("photo.png"), {"type": "text", "text": "What is it?"}])
    ref = _check_against_llm(r, llm, chat_prompt(image=["photo.png"], text="What is it?"))
    assert ref.prompt_token_ids.count(IMAGE_PAD) == 12  # 6 x 8 patches of 16 px, merged 2 x 2


def test_chat_with_a_video_equals_llm(served):
    kind, client, _, llm = served
    r = _chat(client, [video_part("odd7_h264_2fps.mp4"), {"type": "text", "text": "What moves?"}])
    ref = _check_against_llm(r, llm, chat_prompt(video=["odd7_h264_2fps.mp4"], text="What moves?"))
    assert re.search(r"<\d+\.\d seconds><\|vision_start\|><\|video_pad\|>",
                     llm.get_tokenizer().decode(ref.prompt_token_ids))


def test_tokenize_gives_placeholder_ranges_and_timestamps(served):
    kind, _, base_url, llm = served
    content = [image_part("gray.png"), video_part("pan_vp9_10fps.webm"), {"type": "text", "text": "Both?"}]
    body = {"messages": [{"role": "user", "content": content}], **MM}
    r = httpx.post(f"{base_url}/tokenize", json=body, headers=AUTH, timeout=120).json()
    ids = r["tokens"]
    assert ids == llm.engine.prepare(chat_prompt(image=["gray.png"], video=["pan_vp9_10fps.webm"],
                                                 text="Both?")).prompt_token_ids
    assert r["count"] == len(ids)
    image, *frames = r["placeholders"]
    assert image["modality"] == "image" and image["length"] == ids.count(IMAGE_PAD) == 16
    assert len(frames) > 1 and {f["modality"] for f in frames} == {"video"}  # one pad run per temporal patch
    assert sum(f["length"] for f in frames) == ids.count(VIDEO_PAD)
    for ph, pad in [(image, IMAGE_PAD)] + [(f, VIDEO_PAD) for f in frames]:
        assert ids[ph["offset"]:ph["offset"] + ph["length"]] == [pad] * ph["length"]
        assert ids[ph["offset"] - 1] == START and ids[ph["offset"] + ph["length"]] == END
    decode = llm.get_tokenizer().decode
    stamps, prev_end = [], image["offset"] + image["length"]
    for f in frames:  # the "<t seconds>" text between the previous run and each frame's <|vision_start|>
        between = decode(ids[prev_end:f["offset"] - 1])
        stamps.append(float(re.search(r"<(\d+(?:\.\d+)?) seconds>$", between)[1]))
        prev_end = f["offset"] + f["length"]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)


def test_responses_equals_llm(served):
    kind, client, _, llm = served
    items = [{"role": "user", "content": [{"type": "input_image", "image_url": url(IMAGES / "photo_q90.jpg")},
                                          {"type": "input_text", "text": "Colour?"}]}]
    r = client.responses.create(model="m", input=items, instructions="Answer briefly.", temperature=0.0,
                                max_output_tokens=5, extra_body=MM)
    prompt = chat_prompt(image=["photo_q90.jpg"], text="Colour?")
    prompt["messages"].insert(0, {"role": "system", "content": "Answer briefly."})
    ref = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=5), use_tqdm=False)[0]
    last = r.output[-1].model_extra
    assert last["prompt_token_ids"] == ref.prompt_token_ids
    assert last["generation_token_ids"] == ref.outputs[0].token_ids
    assert last["generation_log_probs"] == ref.outputs[0].logprobs
    assert r.output_text == ref.outputs[0].text


def test_second_turn_starts_with_the_first_turns_exact_ids(served):
    kind, client, _, llm = served
    turn1 = [image_part("photo.png"), {"type": "text", "text": "Describe it."}]
    # min_tokens holds EOS back for three tokens, then the bias makes the model close its turn with EOS
    first = _chat(client, turn1, max_tokens=8, logit_bias={str(EOS): 100}, extra_body={"min_tokens": 3})
    p1, g1 = first.model_extra["prompt_token_ids"], first.choices[0].model_extra["token_ids"]
    assert g1[-1] == EOS and len(g1) == 4 and first.choices[0].finish_reason == "stop"
    messages = [{"role": "user", "content": turn1},
                {"role": "assistant", "content": first.choices[0].message.content,
                 "prompt_token_ids": p1, "generation_token_ids": g1},
                {"role": "user", "content": [video_part("odd7_h264_2fps.mp4"), {"type": "text", "text": "And?"}]}]
    second = client.chat.completions.create(model="m", messages=messages, max_tokens=3, temperature=0.0,
                                            extra_body={**MM, "return_token_ids": True})
    p2 = second.model_extra["prompt_token_ids"]
    assert p2[:len(p1) + len(g1)] == p1 + g1, "the second prompt must start with the first turn's exact ids"
    assert p2.count(IMAGE_PAD) == p1.count(IMAGE_PAD)  # the first image is not expanded twice
    assert p2.count(VIDEO_PAD) > 1 and b"seconds>" in llm.get_tokenizer().decode(p2[len(p1):]).encode()
    ref = llm.generate({"prompt_token_ids": p2, "multi_modal_data": {"image": [IMAGES / "photo.png"],
                                                                     "video": [VIDEOS / "odd7_h264_2fps.mp4"]},
                        "media_tokens_preexpanded": True, **MM},
                       SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)[0]
    assert ref.prompt_token_ids == p2
    assert second.choices[0].model_extra["token_ids"] == ref.outputs[0].token_ids
