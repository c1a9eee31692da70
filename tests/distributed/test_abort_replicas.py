"""Through 2 Ray replicas: /abort_requests reaches the replica serving the id (stream and whole, partials in the
error), and render then generate equals chat bit for bit."""

from __future__ import annotations

import base64
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from replica_cases import png

from servers.openai.launch import BackgroundServer

RUNAWAY = 900
PROMPT = [{"role": "user", "content": "Count slowly:"}]


@pytest.fixture(scope="module")
def served(two_replica_server: BackgroundServer) -> BackgroundServer:
    return two_replica_server


def _post(srv: BackgroundServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{srv.base_url}{path}", json=body, timeout=120)


def _greedy(srv: BackgroundServer, n: int) -> list[int]:
    body = {"messages": PROMPT, "max_tokens": n, "min_tokens": n, "temperature": 0, "return_token_ids": True}
    return _post(srv, "/v1/chat/completions", body).json()["choices"][0]["token_ids"]


def _routed(srv: BackgroundServer, rid: str) -> None:
    deadline = time.monotonic() + 60
    while rid not in srv.state.backend._inflight:
        assert time.monotonic() < deadline, f"{rid} was never routed"
        time.sleep(0.01)


def test_abort_by_id_mid_stream_on_a_replica(served):
    body = {"messages": PROMPT, "max_tokens": RUNAWAY, "min_tokens": RUNAWAY, "temperature": 0, "stream": True,
            "return_token_ids": True, "request_id": "rs-1"}
    events: list[str] = []
    with httpx.stream("POST", f"{served.base_url}/v1/chat/completions", json=body, timeout=120) as resp:
        lines = resp.iter_lines()
        for line in lines:
            events += [line] if line.startswith("data: {") else []
            if len(events) >= 3:
                break
        assert _post(served, "/abort_requests", {"request_ids": ["rs-1"]}).json()["aborted"] == ["chatcmpl-rs-1"]
        events += [line for line in lines if line.startswith("data:")]
    error = json.loads(events[-2][6:])
    assert error["error"]["code"] == 503 and events[-1] == "data: [DONE]"
    (part,) = error["partial"]["choices"]
    streamed = [t for e in events[:-2] for c in json.loads(e[6:])["choices"] for t in c.get("token_ids") or []]
    assert part["token_ids"][:len(streamed)] == streamed and len(part["logprobs"]) == len(part["token_ids"])
    assert part["token_ids"] == _greedy(served, len(part["token_ids"]))


def test_abort_a_whole_request_on_a_replica(served):
    body = {"messages": PROMPT, "max_tokens": RUNAWAY, "min_tokens": RUNAWAY, "temperature": 0, "request_id": "rw-1"}
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(_post, served, "/v1/chat/completions", body)
        _routed(served, "chatcmpl-rw-1")
        time.sleep(0.3)
        assert _post(served, "/abort_requests", {"request_ids": ["chatcmpl-rw-1"]}).json()["not_found"] == []
        r = running.result(timeout=60)
    assert r.status_code == 503, r.text
    (part,) = r.json()["partial"]["choices"]
    assert part["token_ids"] and part["token_ids"] == _greedy(served, len(part["token_ids"]))


def test_render_then_generate_equals_chat_through_replicas(served):
    url = f"data:image/png;base64,{base64.b64encode(png('blue')).decode()}"
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                      {"type": "text", "text": "Colour?"}]}],
            "max_tokens": 6, "temperature": 0.8, "seed": 7, "n": 2, "return_token_ids": True, "logprobs": True}
    chat = _post(served, "/v1/chat/completions", body).json()
    rendered = _post(served, "/v1/chat/completions/render", body).json()
    gen = _post(served, "/inference/v1/generate", rendered).json()
    assert [c["token_ids"] for c in gen["choices"]] == [c["token_ids"] for c in chat["choices"]]
    assert [[e["logprob"] for e in c["logprobs"]["content"]] for c in gen["choices"]] == \
        [c["message"]["generation_log_probs"] for c in chat["choices"]]
