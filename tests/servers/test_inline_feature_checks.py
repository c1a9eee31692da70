"""Inline features are checked at admission: finite, in the range the checkpoint's normalisation makes, and shaped
and specced as its patch spec, else a 400 naming the problem; a poisoned request leaves the next ones bit for bit."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from server_cases import API_KEY, CKPT, MEDIA, SMALL, data_url

from mm_infer.prompt.request import MediaItem
from servers.openai.config import FetchConfig, ServerConfig
from servers.openai.launch import BackgroundServer, free_port
from servers.openai.media.features import decode_item, encode_item

AUTH = {"Authorization": f"Bearer {API_KEY}"}
VIDEO = MEDIA / "videos" / "pan_h264_2fps_59.mp4"
KW = {"max_pixels": SMALL, "video_max_pixels": SMALL, "num_frames": 4}


def _post(server: BackgroundServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers=AUTH, timeout=120)


def _part(kind: str) -> dict:
    if kind == "image":
        return {"type": "image_url", "image_url": {"url": data_url(MEDIA / "images" / "photo.png", "image/png")}}
    return {"type": "video_url", "video_url": {"url": data_url(VIDEO, "video/mp4")}}


def _chat(parts: list[dict], text: str = "Describe it.", **extra) -> dict:
    return {"model": CKPT.name, "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}],
            "max_tokens": 12, "temperature": 0, "logprobs": True, "return_token_ids": True, "mm_processor_kwargs": KW,
            "ignore_eos": True, **extra}


def _rendered(server: BackgroundServer, kind: str = "image") -> dict:
    r = _post(server, "/v1/chat/completions/render", _chat([_part(kind)], mm_payload="tensors"))
    assert r.status_code == 200, r.text
    return r.json()


def _split(data: str) -> tuple[dict, bytes]:
    head, raw = base64.b64decode(data).split(b"\n", 1)
    return json.loads(head), raw


def _join(head: dict, raw: bytes) -> str:
    return base64.b64encode(json.dumps(head).encode() + b"\n" + raw).decode("ascii")


def _rows(data: str, fill: float | None = None) -> str:
    """The item as the older rows payload, its pixel rows set to `fill` (None: as they are)."""
    item = decode_item(data, "image", "test")
    rows = item.pixel_values.clone()
    if fill is not None:
        rows[:] = fill
    return encode_item(MediaItem("image", rows, item.grid_thw, item.content_hash))


def _spec(data: str, **fields) -> str:
    head, raw = _split(data)
    return _join({**head, "spec": {**head["spec"], **fields}}, raw)


def _with_item(rendered: dict, data: str, kind: str = "image", tag: str = "x") -> dict:
    """The rendered request carrying `data` inline under a hash the server has never seen (so it is decoded)."""
    f = rendered["features"]
    return {**rendered, "features": {**f, "kwargs_data": {kind: [data]}, "mm_hashes": {kind: [f"tampered-{tag}"]}}}


def _tampered(data: str) -> list[tuple[str, str, str]]:
    """(case, payload, what the 400 must name)."""
    mean = _split(data)[0]["spec"]["image_mean"]
    return [
        ("nan-rows", _rows(data, float("nan")), "not finite"),
        ("inf-rows", _rows(data, float("inf")), "not finite"),
        ("3e38-rows", _rows(data, 3e38), "outside"),
        ("3-rows", _rows(data, 3.0), "outside"),
        ("merge-1", _spec(data, merge_size=1), "merge_size"),
        ("zero-std", _spec(data, image_std=[0.0, 0.0, 0.0]), "image_std"),
        ("mean", _spec(data, image_mean=[mean[0] + 0.1, *mean[1:]]), "image_mean"),
        ("temporal-1", _spec(data, temporal_patch_size=1), "temporal_patch_size"),
        ("patch-7", _spec(data, patch_size=7), "patch_size"),
        ("nan-std", _join({**_split(data)[0], "spec": {**_split(data)[0]["spec"], "image_std": [float("nan")] * 3}},
                          _split(data)[1]), "image_std"),
    ]


def test_tampered_inline_items_are_400s_naming_the_problem(server) -> None:
    rendered = _rendered(server)
    data = rendered["features"]["kwargs_data"]["image"][0]
    for case, payload, words in _tampered(data):
        r = _post(server, "/inference/v1/generate", _with_item(rendered, payload, tag=case))
        assert r.status_code == 400, (case, r.text)
        err = r.json()["error"]
        assert words in err["message"] and err["param"] == "features.kwargs_data", (case, err)
        assert "features image 0" in err["message"], (case, err)


def test_rows_of_the_wrong_width_or_dtype_are_400s(server) -> None:
    rendered = _rendered(server)
    data = rendered["features"]["kwargs_data"]["image"][0]
    head, raw = _split(_rows(data))
    rows = torch.frombuffer(bytearray(raw), dtype=torch.float32).view(head["shape"])
    half = rows[:, : rows.shape[1] // 2].contiguous()
    narrow = _join({**head, "shape": list(half.shape)}, half.numpy().tobytes())
    r = _post(server, "/inference/v1/generate", _with_item(rendered, narrow, tag="narrow"))
    assert r.status_code == 400 and "rows of 1176" in r.json()["error"]["message"], r.text
    wide = rows.to(torch.uint8)
    as_bytes = _join({**head, "dtype": "uint8"}, wide.numpy().tobytes())
    r = _post(server, "/inference/v1/generate", _with_item(rendered, as_bytes, tag="uint8"))
    assert r.status_code == 400 and "not float" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("kind", ["image", "video"])
def test_untampered_inline_items_still_generate(server, kind) -> None:
    # what render sends, as frames or as the older rows (their values are what the normalisation makes)
    rendered = _rendered(server, kind)
    data = rendered["features"]["kwargs_data"][kind][0]
    plain = _post(server, "/inference/v1/generate", _with_item(rendered, data, kind, tag=f"plain-{kind}"))
    assert plain.status_code == 200, plain.text
    if kind == "image":
        rows = _post(server, "/inference/v1/generate", _with_item(rendered, _rows(data), tag="rows"))
        assert rows.status_code == 200, rows.text
        assert rows.json()["choices"][0]["token_ids"] == plain.json()["choices"][0]["token_ids"]


# --- isolation over HTTP, on every backend: batch-invariant, so answers do not depend on who else is in the batch --

BACKENDS = {"thread": {"engine_core": "thread"}, "process": {"engine_core": "process"}, "replicas": {"replicas": 2}}


@pytest.fixture(scope="module", params=list(BACKENDS))
def plain_server(request: pytest.FixtureRequest) -> Iterator[BackgroundServer]:
    # no prefix caching: a request run again is computed again, whatever blocks it gets; batch-invariant: the same
    # bits alone and beside others, so innocent answers during the attack must equal the baseline too
    if request.param == "replicas":
        pytest.importorskip("ray")
    config = ServerConfig(model_dir=str(CKPT), port=free_port(), api_key=API_KEY, max_body_bytes=4 << 20,
                          fetch=FetchConfig(allowed_media_paths=(MEDIA,), max_bytes=1 << 20),
                          engine_options={"num_kv_blocks": 48, "max_model_len": 512, "enable_prefix_caching": False,
                                          "batch_invariant": True, "cpu_threads": 1},
                          **BACKENDS[request.param])
    srv = BackgroundServer(config).start(timeout_s=300)
    yield srv
    srv.stop()


def _answer(server: BackgroundServer, body: dict) -> tuple:
    """(token ids, logprobs, finish reason) of a chat answer, whole or streamed."""
    if not body.get("stream"):
        r = _post(server, "/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        return c["token_ids"], [e["logprob"] for e in c["logprobs"]["content"]], c["finish_reason"]
    ids, lps, reason = [], [], None
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=body, headers=AUTH, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for c in json.loads(line[6:]).get("choices", []):
                ids += c.get("token_ids") or []
                lps += [e["logprob"] for e in (c.get("logprobs") or {}).get("content") or []]
                reason = c.get("finish_reason") or reason
    return ids, lps, reason


INNOCENT = [_chat([], "Tell me a story about a cat."), _chat([_part("image")]),
            _chat([], "Count to ten.", stream=True), _chat([_part("image")], "What colour is it?", stream=True)]


def test_poisoned_inline_rows_leave_every_other_request_bit_identical(plain_server) -> None:
    # the bug: decode padding read KV slot 0, and 0 x NaN there failed 27 of 80 innocent requests (10 of the next 99)
    baseline = [_answer(plain_server, b) for b in INNOCENT]
    assert all(reason == "length" for _, _, reason in baseline)
    rendered = _rendered(plain_server)
    data = rendered["features"]["kwargs_data"]["image"][0]
    poisoned = [_with_item(rendered, _rows(data, fill), tag=f"poison-{i}")
                for i, fill in enumerate([float("nan"), 3e38] * 2)]
    # during: the poisoned requests alongside the innocent ones (text, image, streamed); each answer bit-identical
    with ThreadPoolExecutor(8) as pool:
        bad = [pool.submit(_post, plain_server, "/inference/v1/generate", p) for p in poisoned]
        good = [pool.submit(_answer, plain_server, b) for b in INNOCENT * 2]
        assert [f.result() for f in good] == baseline * 2, "an innocent answer changed while poison was in flight"
        assert all(f.result().status_code == 400 for f in bad)
    # after: the next 100 requests, 8 at a time, get the baseline's answers bit for bit
    with ThreadPoolExecutor(8) as pool:
        after = list(pool.map(lambda b: _answer(plain_server, b), INNOCENT * 25))
    assert after == baseline * 25
