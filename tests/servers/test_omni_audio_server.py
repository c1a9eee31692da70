"""The OpenAI server on tiny Nemotron Omni with its audio tower: input_audio and audio_url parts give the offline LLM's
tokens for the same clip; audio past the byte cap is a 413, undecodable or too short audio a 400 naming the part."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
import torch
from server_cases import MEDIA, REPO, data_url

from mm_infer import LLM, SamplingParams
from mm_infer.media.omni_audio import AudioFeatureSpec, decode_audio, token_count
from tests.media.test_omni_audio_features import encoded, sweep, wav_bytes

CKPT = REPO / "assets" / "models" / "tiny-nemotron-omni-audio"
pytestmark = pytest.mark.skipif(not CKPT.exists(), reason=f"{CKPT.name} (the lead's audio checkpoint) is not built")
KEY = "k"
AUTH = {"Authorization": f"Bearer {KEY}"}
OPTIONS = {"num_kv_blocks": 256, "max_model_len": 2048, "batch_invariant": True, "cpu_threads": 1}
CAP = 200_000  # the server's media byte cap: a 1 s WAV (32 kB) fits, a 7 s one does not
SO_START, SO_EMB, SO_END = 3009, 3010, 3011
WAV = wav_bytes(sweep(16037))  # 1 s + 37 samples: 13 tokens
SHORT_WAV = wav_bytes(sweep(10245))  # 9 tokens


@pytest.fixture(scope="module")
def omni() -> Iterator[tuple[openai.OpenAI, str, LLM]]:
    from servers.openai.config import FetchConfig, ServerConfig
    from servers.openai.launch import BackgroundServer, free_port

    threads = torch.get_num_threads()
    srv = BackgroundServer(ServerConfig(model_dir=str(CKPT), port=free_port(), api_key=KEY, max_body_bytes=4 << 20,
                                        extra_served_names=("m",), fetch=FetchConfig(max_bytes=CAP),
                                        engine_options=OPTIONS)).start()
    client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)
    yield client, srv.base_url, LLM(str(CKPT), **OPTIONS)
    assert srv.state.metrics.running == 0, "a request was never closed"
    srv.stop()
    torch.set_num_threads(threads)


def input_audio(data: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def audio_url(data: bytes, mime: str = "audio/wav") -> dict:
    return {"type": "audio_url", "audio_url": {"url": f"data:{mime};base64,{base64.b64encode(data).decode()}"}}


def chat_body(parts: list[dict], **extra) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": parts}], "max_tokens": 6, "temperature": 0.0,
            "logprobs": True, "return_token_ids": True, **extra}


def post(base_url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{base_url}{path}", json=body, headers=AUTH, timeout=120)


def llm_chat(llm: LLM, kinds: list[str], mm: dict, text: str):
    content = [*({"type": k} for k in kinds), {"type": "text", "text": text}]
    prompt = {"messages": [{"role": "user", "content": content}], "multi_modal_data": mm}
    return llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=6, logprobs=0), use_tqdm=False)[0]


def assert_same(r: httpx.Response, ref) -> dict:
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    assert body["prompt_token_ids"] == ref.prompt_token_ids
    assert choice["token_ids"] == ref.outputs[0].token_ids and len(ref.outputs[0].token_ids) == 6
    got = [t["logprob"] for t in choice["logprobs"]["content"]]
    assert max(abs(a - b) for a, b in zip(got, ref.outputs[0].logprobs, strict=True)) <= 1e-5
    return body


@pytest.mark.parametrize("make", [input_audio, audio_url], ids=["input_audio", "audio_url"])
def test_chat_with_an_audio_part_equals_llm(omni, make):
    # catches: the part dropped (no <so_embedding> run), features from another decode, a run of the wrong length
    _, base_url, llm = omni
    ref = llm_chat(llm, ["audio"], {"audio": [WAV]}, "What is heard?")
    body = assert_same(post(base_url, "/v1/chat/completions", chat_body([make(WAV),
                                                                         {"type": "text", "text": "What is heard?"}])),
                       ref)
    ids = body["prompt_token_ids"]
    at = ids.index(SO_START)
    assert ids[at + 1:at + 14] == [SO_EMB] * 13 and ids[at + 14] == SO_END


def test_responses_with_an_audio_part_equals_llm(omni):
    # catches: the Responses API refusing (or dropping) an input_audio part that chat takes
    client, _, llm = omni
    items = [{"role": "user", "content": [input_audio(WAV), {"type": "input_text", "text": "What is heard?"}]}]
    r = client.responses.create(model="m", input=items, temperature=0.0, max_output_tokens=6)
    ref = llm_chat(llm, ["audio"], {"audio": [WAV]}, "What is heard?")
    last = r.output[-1].model_extra
    assert last["prompt_token_ids"] == ref.prompt_token_ids and SO_EMB in ref.prompt_token_ids
    assert last["generation_token_ids"] == ref.outputs[0].token_ids


def test_two_clips_and_an_image_keep_their_order(omni):
    # catches: audio items sorted after images, or two clips swapped (their runs have different lengths)
    _, base_url, llm = omni
    png = MEDIA / "images" / "gray.png"
    parts = [input_audio(SHORT_WAV), {"type": "image_url", "image_url": {"url": data_url(png, "image/png")}},
             audio_url(WAV), {"type": "text", "text": "Both?"}]
    ref = llm_chat(llm, ["audio", "image", "audio"], {"audio": [SHORT_WAV, WAV], "image": [png]}, "Both?")
    ids = assert_same(post(base_url, "/v1/chat/completions", chat_body(parts)), ref)["prompt_token_ids"]
    starts = [i for i, t in enumerate(ids) if t == SO_START]
    assert [ids[s + 1:].index(SO_END) for s in starts] == [9, 13]


def test_an_mp3_clip_is_decoded(omni):
    # catches: the `format` ignored (an MP3 read as WAV), or MP3 refused
    _, base_url, _ = omni
    mp3 = encoded(sweep(16037), "libmp3lame", "mp3")
    r = post(base_url, "/tokenize", {"messages": [{"role": "user", "content": [input_audio(mp3, "mp3")]}]})
    assert r.status_code == 200, r.text
    n = token_count(decode_audio(mp3).numel(), AudioFeatureSpec())
    assert r.json()["tokens"].count(SO_EMB) == n
    assert [(p["modality"], p["length"]) for p in r.json()["placeholders"]] == [("audio", n)]


@pytest.mark.parametrize("make", [input_audio, audio_url], ids=["input_audio", "audio_url"])
def test_audio_past_the_byte_cap_is_413(omni, make):
    # catches: an unbounded base64 payload decoded and run through the feature extractor
    _, base_url, _ = omni
    big = wav_bytes(sweep(7 * 16000))
    assert len(big) > CAP
    r = post(base_url, "/v1/chat/completions", chat_body([make(big)]))
    assert r.status_code == 413, r.text


@pytest.mark.parametrize(("data", "words"), [
    (b"RIFF not really a wav file at all", "undecodable audio"),
    (wav_bytes(np.zeros(200, np.int16)), "shorter than 2 mel frames"),
], ids=["undecodable", "too-short"])
def test_bad_audio_is_400_naming_the_part(omni, data, words):
    # catches: a 500 from the decoder, or an error that does not say which part failed
    _, base_url, _ = omni
    r = post(base_url, "/v1/chat/completions", chat_body([{"type": "text", "text": "x"}, input_audio(data)]))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"] and err["message"].startswith("messages[0].content[1]: ")
    assert err["param"] == "messages[0].content[1]"


def test_an_audio_part_without_data_is_400(omni):
    _, base_url, _ = omni
    r = post(base_url, "/v1/chat/completions", chat_body([{"type": "input_audio"}]))
    assert r.status_code == 400 and "needs a URL" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("payload", [None, "tensors"], ids=["by-reference", "inline"])
def test_render_then_generate_equals_chat(omni, payload):
    # catches: render dropping the audio features (generate would find a <so_embedding> run with no item), or an
    # inline clip that comes back with other features or another token count
    _, base_url, _ = omni
    body = chat_body([audio_url(WAV), input_audio(SHORT_WAV), {"type": "text", "text": "x"}], max_tokens=5)
    chat = post(base_url, "/v1/chat/completions", body).json()
    rendered = post(base_url, "/v1/chat/completions/render", {**body, "mm_payload": payload})
    assert rendered.status_code == 200, rendered.text
    out = rendered.json()
    assert out["token_ids"] == chat["prompt_token_ids"]
    feats = out["features"]
    assert list(feats["mm_hashes"]) == ["audio"] and len(feats["mm_hashes"]["audio"]) == 2
    assert [p["length"] for p in feats["mm_placeholders"]["audio"]] == [13, 9]
    if payload == "tensors":  # hashes this server never stored: the clips are decoded from the inline payload
        feats["mm_hashes"]["audio"] = [str(k) * 64 for k in (1, 2)]
    gen = post(base_url, "/inference/v1/generate", out)
    assert gen.status_code == 200, gen.text
    assert gen.json()["choices"][0]["token_ids"] == chat["choices"][0]["token_ids"]


def test_an_inline_clip_with_a_forged_token_count_is_400(omni):
    # catches: the client's token count trusted (features and placeholder run would disagree in the model)
    _, base_url, _ = omni
    body = chat_body([input_audio(WAV)], max_tokens=2)
    out = post(base_url, "/v1/chat/completions/render", {**body, "mm_payload": "tensors"}).json()
    head, raw = base64.b64decode(out["features"]["kwargs_data"]["audio"][0]).split(b"\n", 1)
    forged = head.replace(b'"tokens": 13', b'"tokens": 12')
    assert forged != head
    out["features"]["kwargs_data"]["audio"][0] = base64.b64encode(forged + b"\n" + raw).decode()
    out["features"]["mm_hashes"]["audio"][0] = "0" * 64  # not in the cache: the inline item is decoded
    r = post(base_url, "/inference/v1/generate", out)
    assert r.status_code == 400 and "says 12 tokens, 101 mel frames make 13" in r.json()["error"]["message"], r.text


def test_second_turn_keeps_the_first_clip_expanded_once(omni):
    # catches: the first turn's expanded <so_embedding> run expanded again, or its clip dropped from the second turn
    _, base_url, llm = omni
    eos = 3002  # <|im_end|>
    turn1 = [input_audio(WAV), {"type": "text", "text": "Listen."}]
    one = post(base_url, "/v1/chat/completions", chat_body(turn1, max_tokens=8, logit_bias={str(eos): 100},
                                                           min_tokens=3)).json()
    p1, g1 = one["prompt_token_ids"], one["choices"][0]["token_ids"]
    assert g1[-1] == eos
    messages = [{"role": "user", "content": turn1},
                {"role": "assistant", "content": one["choices"][0]["message"]["content"], "prompt_token_ids": p1,
                 "generation_token_ids": g1},
                {"role": "user", "content": [audio_url(SHORT_WAV), {"type": "text", "text": "And?"}]}]
    two = post(base_url, "/v1/chat/completions", {**chat_body([]), "messages": messages, "max_tokens": 3}).json()
    p2 = two["prompt_token_ids"]
    assert p2[:len(p1) + len(g1)] == p1 + g1
    assert p2.count(SO_EMB) == 13 + 9 and p2.count(SO_START) == 2
    ref = llm.generate({"prompt_token_ids": p2, "multi_modal_data": {"audio": [WAV, SHORT_WAV]},
                        "media_tokens_preexpanded": True}, SamplingParams(temperature=0.0, max_tokens=3),
                       use_tqdm=False)[0]
    assert ref.prompt_token_ids == p2 and two["choices"][0]["token_ids"] == ref.outputs[0].token_ids



def test_limit_mm_per_prompt_counts_audio_parts():
    # catches: --limit-mm-per-prompt '{"audio": 1}' ignored for audio parts (a clip past it fetched and encoded)
    from servers.openai.config import ServerConfig
    from servers.openai.launch import BackgroundServer, free_port

    srv = BackgroundServer(ServerConfig(model_dir=str(CKPT), port=free_port(), api_key=KEY,
                                        limit_mm_per_prompt={"audio": 1}, engine_options=OPTIONS)).start()
    try:
        ok = post(srv.base_url, "/tokenize", {"messages": [{"role": "user", "content": [input_audio(WAV)]}]})
        assert ok.status_code == 200, ok.text
        r = post(srv.base_url, "/v1/chat/completions", chat_body([input_audio(WAV), audio_url(SHORT_WAV)],
                                                                 model=CKPT.name))
        assert r.status_code == 400 and "at most 1 audio(s)" in r.json()["error"]["message"], r.text
    finally:
        srv.stop()
