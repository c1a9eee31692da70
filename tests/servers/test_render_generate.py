"""Token-in/token-out: /v1/chat/completions/render then /inference/v1/generate answers chat's tokens and logprobs
bit for bit (image, video, n > 1, seeded sampling); ids that do not match their features are 400s naming the item."""

from __future__ import annotations

import json

import httpx
import pytest
from server_cases import API_KEY, MEDIA, SMALL, data_url

AUTH = {"Authorization": f"Bearer {API_KEY}"}
VIDEO = MEDIA / "videos" / "pan_h264_2fps_59.mp4"
KW = {"max_pixels": SMALL, "video_max_pixels": SMALL, "num_frames": 4}


def _post(server, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers={**AUTH, **(headers or {})}, timeout=120)


def _messages(parts: list[dict], text: str = "Describe it.") -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def _image() -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(MEDIA / "images" / "photo.png", "image/png")}}


def _video() -> dict:
    return {"type": "video_url", "video_url": {"url": data_url(VIDEO, "video/mp4")}}


def _chat_body(parts: list[dict], **sampling) -> dict:
    return {"model": "m", "messages": _messages(parts), "max_tokens": 8, "logprobs": True, "top_logprobs": 2,
            "return_token_ids": True, "mm_processor_kwargs": KW, **sampling}


def _render_then_generate(server, body: dict, **extra) -> tuple[dict, dict]:
    rendered = _post(server, "/v1/chat/completions/render", body)
    assert rendered.status_code == 200, rendered.text
    r = _post(server, "/inference/v1/generate", {**rendered.json(), **extra})
    assert r.status_code == 200, r.text
    return rendered.json(), r.json()


def _assert_same(chat: dict, gen: dict) -> None:
    assert len(chat["choices"]) == len(gen["choices"])
    for c, g in zip(sorted(chat["choices"], key=lambda c: c["index"]), gen["choices"], strict=True):
        assert g["token_ids"] == c["token_ids"] and g["finish_reason"] == c["finish_reason"]
        assert [e["logprob"] for e in g["logprobs"]["content"]] == c["message"]["generation_log_probs"]
        tops = [[t["logprob"] for t in e["top_logprobs"]] for e in c["logprobs"]["content"]]
        ours = [[t["logprob"] for t in e["top_logprobs"]][:2] for e in g["logprobs"]["content"]]
        assert ours == tops  # both list the sampled token first, then the top others (chat keeps k in all)


@pytest.mark.parametrize("parts", [[_image()], [_video()], [_image(), _video()]], ids=["image", "video", "both"])
def test_render_then_generate_equals_chat_bit_for_bit(server, parts) -> None:
    body = _chat_body(parts, temperature=0)
    chat = _post(server, "/v1/chat/completions", body).json()
    rendered, gen = _render_then_generate(server, body, return_token_ids=True)
    assert rendered["token_ids"] == chat["prompt_token_ids"] == gen["prompt_token_ids"]
    media = [m for k in ("image", "video") for m in (rendered["features"]["mm_items"].get(k) or [])]
    assert sorted(m["content_hash"] for m in media) == sorted(m["content_hash"] for m in chat["prompt_media"])
    hashes = rendered["features"]["mm_hashes"]
    assert rendered["features"]["kwargs_data"] == {k: [None] * len(v) for k, v in hashes.items()}  # by reference
    assert gen["mm_placeholders"] == rendered["features"]["mm_placeholders"]
    _assert_same(chat, gen)


def test_seeded_sampling_with_n_and_inline_pixels(server) -> None:
    body = _chat_body([_image(), _video()], temperature=1.0, top_p=0.9, seed=1234, n=3)
    chat = _post(server, "/v1/chat/completions", body).json()
    _, by_ref = _render_then_generate(server, body)
    _, inline = _render_then_generate(server, {**body, "mm_payload": "tensors"})
    _assert_same(chat, by_ref)
    _assert_same(chat, inline)
    assert len({tuple(c["token_ids"]) for c in chat["choices"]}) > 1, "seeded samples should differ"


def test_inline_pixels_work_when_the_cache_lost_them(server) -> None:
    rendered = _post(server, "/v1/chat/completions/render", {**_chat_body([_image()], temperature=0),
                                                             "mm_payload": "tensors"}).json()
    assert isinstance(rendered["features"]["kwargs_data"]["image"][0], str)
    server.state.features.clear()
    r = _post(server, "/inference/v1/generate", rendered)
    assert r.status_code == 200, r.text
    dropped = {**rendered, "features": {**rendered["features"], "kwargs_data": None}}
    r = _post(server, "/inference/v1/generate", dropped)
    assert r.status_code == 400 and "features image 0" in r.json()["error"]["message"]
    assert "feature cache" in r.json()["error"]["message"]


def test_streamed_generate_adds_up_to_the_whole(server) -> None:
    body = _chat_body([_image()], temperature=0)
    rendered, whole = _render_then_generate(server, body)
    ids: list[int] = []
    lps: list[float] = []
    with httpx.stream("POST", f"{server.base_url}/inference/v1/generate", json={**rendered, "stream": True},
                      headers=AUTH, timeout=120) as resp:
        assert resp.status_code == 200 and resp.headers["x-request-id"] == f"generate-tokens-{rendered['request_id']}"
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    for e in events:
        for c in e["choices"]:
            ids += c["token_ids"]
            lps += [x["logprob"] for x in c["logprobs"]["content"]]
    assert ids == whole["choices"][0]["token_ids"]
    assert lps == [x["logprob"] for x in whole["choices"][0]["logprobs"]["content"]]


def test_trl_shapes(server) -> None:
    """TRL 1.16's image_features + generate: a media-only render, its placeholders moved onto the trainer's ids."""
    rendered = _post(server, "/v1/chat/completions/render",
                     {"model": "m", "messages": [{"role": "user", "content": [_image()]}], "max_tokens": 1}).json()
    features = rendered["features"]
    (ph,) = features["mm_placeholders"]["image"]
    pad = rendered["token_ids"][ph["offset"]]
    chat_body = {**_chat_body([_image()], temperature=0), "mm_processor_kwargs": None}
    chat = _post(server, "/v1/chat/completions", chat_body).json()
    ids = chat["prompt_token_ids"]
    start = ids.index(pad)
    features = {**features, "mm_placeholders": {"image": [{"offset": start, "length": ph["length"]}]}}
    sp = {"n": 1, "repetition_penalty": 1.0, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
          "max_tokens": 8, "logprobs": 0, "output_kind": 2}
    r = _post(server, "/inference/v1/generate", {"request_id": "trl-x", "model": "m", "token_ids": ids,
                                                 "features": features, "sampling_params": sp})
    assert r.status_code == 200, r.text
    (choice,) = r.json()["choices"]
    assert choice["token_ids"] == chat["choices"][0]["token_ids"]
    assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert [[t["token"] for t in e["top_logprobs"]] for e in choice["logprobs"]["content"]] == \
        [[f"token_id:{t}"] for t in choice["token_ids"]]


def test_completions_render_then_generate(server) -> None:
    body = {"model": "m", "prompt": ["Hello there", [1, 2, 3]], "max_tokens": 6, "temperature": 0,
            "return_token_ids": True, "logprobs": 0}
    rendered = _post(server, "/v1/completions/render", body).json()
    assert [r["request_id"][-2:] for r in rendered] == ["-0", "-1"] and rendered[1]["token_ids"] == [1, 2, 3]
    whole = _post(server, "/v1/completions", body).json()["choices"]
    for i, req in enumerate(rendered):
        (g,) = _post(server, "/inference/v1/generate", req).json()["choices"]
        assert g["token_ids"] == whole[i]["token_ids"]
        assert [e["logprob"] for e in g["logprobs"]["content"]] == whole[i]["logprobs"]["token_logprobs"]


def _rendered(server) -> dict:
    return _post(server, "/v1/chat/completions/render", _chat_body([_image(), _video()], temperature=0)).json()


def _with(rendered: dict, **features) -> dict:
    return {**rendered, "features": {**rendered["features"], **features}}


def _cases(r: dict) -> list[tuple[dict, str]]:
    img = r["features"]["mm_placeholders"]["image"][0]
    ids, hashes = r["token_ids"], r["features"]["mm_hashes"]
    cut = ids[:img["offset"]] + ids[img["offset"] + 1:]  # one image pad fewer
    moved = {"image": [{"offset": img["offset"] + 1, "length": img["length"]}],
             "video": r["features"]["mm_placeholders"]["video"]}
    return [
        ({**r, "token_ids": cut}, "image 0"),
        (_with(r, mm_placeholders=moved), "features image 0"),
        (_with(r, mm_hashes={**hashes, "image": ["0" * 64]}), "features image 0"),
        (_with(r, mm_hashes={"image": hashes["video"], "video": hashes["image"]}), "features image 0"),
        ({**r, "features": None}, "image"),
        ({**r, "token_ids": [*ids[:3], 10 ** 9]}, "token_ids"),
        (_with(r, kwargs_data={"image": ["bm90IGFuIGl0ZW0="], "video": [None]},
               mm_hashes={**hashes, "image": ["1" * 64]}), "features image 0"),
        ({**r, "sampling_params": {"bad_words": ["x"]}}, "sampling_params.bad_words"),
        ({**r, "sampling_params": {"nonsense": 1}}, "sampling_params.nonsense"),
        ({**r, "content_parts": [{"type": "image_url"}]}, "content_parts"),
    ]


def test_ids_that_do_not_match_their_features_are_400s_naming_the_item(server) -> None:
    for body, words in _cases(_rendered(server)):
        r = _post(server, "/inference/v1/generate", body)
        assert r.status_code == 400, (words, r.text)
        err = r.json()["error"]
        assert words in err["message"] or words == err["param"], (words, err)


def test_render_errors(server) -> None:
    r = _post(server, "/v1/chat/completions/render", {**_chat_body([_image()]), "mm_payload": "all"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "mm_payload"
    r = _post(server, "/v1/completions/render", {"model": "m", "prompt": "x", "echo": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"
    r = _post(server, "/v1/chat/completions/render", {"model": "m", "messages": []})
    assert r.status_code == 400
    r = _post(server, "/inference/v1/generate", {"token_ids": [5] * 1100})
    assert r.status_code == 400 and "max_model_len" in r.json()["error"]["message"]
    r = _post(server, "/inference/v1/generate", {"token_ids": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "token_ids"
