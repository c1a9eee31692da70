"""Operational hygiene: 4xx are one WARNING line counted under their real status; /metrics and /version behind
the key; non-finite logprobs are JSON-compliant; slow clients cannot hold a connection."""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import httpx
import pytest
from server_cases import API_KEY
from test_errors import AUTH, assert_error, b64, chat, image, post

from servers.openai.answers.logprobs import LOGPROB_FLOOR
from servers.openai.web.metrics import Metrics
from servers.openai.web.middleware import ServerMiddleware


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _count(text: str, status: int) -> int:
    line = next((ln for ln in text.splitlines()
                 if ln.startswith(f'mm_infer_requests_total{{endpoint="/v1/chat/completions",status="{status}"}}')),
                None)
    return int(float(line.split()[-1])) if line else 0


def test_a_media_4xx_is_one_warning_line_and_counted_as_a_4xx(server):
    """F11: every media or prompt 4xx logged an 86-line ERROR traceback and was counted as status="500"."""
    records = _Records()
    loggers = [logging.getLogger(n) for n in ("mm_infer.server", "uvicorn.error", "uvicorn")]
    for lg in loggers:
        lg.addHandler(records)
    try:
        before = httpx.get(f"{server.base_url}/metrics", headers=AUTH).text
        assert_error(post(server, "/v1/chat/completions", chat(image(b64(b"not a png")))), 400, "")
        after = httpx.get(f"{server.base_url}/metrics", headers=AUTH).text
    finally:
        for lg in loggers:
            lg.removeHandler(records)
    assert _count(after, 400) == _count(before, 400) + 1 and _count(after, 500) == _count(before, 500)
    mine = [r for r in records.records if r.name == "mm_infer.server"]
    assert len(mine) == 1 and mine[0].levelno == logging.WARNING and mine[0].exc_info is None
    assert "\n" not in mine[0].getMessage() and not [r for r in records.records if r.levelno >= logging.ERROR]


def test_metrics_and_version_need_the_key(server):
    """F17: /metrics and /version answered without the API key."""
    for path in ("/metrics", "/version"):
        assert httpx.get(f"{server.base_url}{path}").status_code == 401
        assert httpx.get(f"{server.base_url}{path}", headers=AUTH).status_code == 200
    assert httpx.get(f"{server.base_url}/health").status_code == 200


@pytest.mark.parametrize("public, expected", [(False, 401), (True, 200)])
def test_metrics_public_opens_only_metrics_and_version(public, expected):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    mw = ServerMiddleware(app, api_key="k", max_body_bytes=1 << 20, metrics=Metrics(), metrics_public=public)

    async def get(path: str) -> int:
        transport = httpx.ASGITransport(app=mw)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return (await c.get(path)).status_code

    assert asyncio.run(get("/metrics")) == expected and asyncio.run(get("/version")) == expected
    assert asyncio.run(get("/v1/models")) == 401 and asyncio.run(get("/health")) == 200


def test_masked_top_logprobs_are_sent_as_the_floor_not_infinity(server):
    """F13: processed_logprobs + top_k gave -inf logprobs: 'Out of range float values' (400) or null when streamed."""
    body = chat("hello", logprobs=True, top_logprobs=5, top_k=2, temperature=1.0, seed=1, max_tokens=3,
                logprobs_mode="processed_logprobs")
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    tops = [t["logprob"] for tok in r.json()["choices"][0]["logprobs"]["content"] for t in tok["top_logprobs"]]
    assert LOGPROB_FLOOR in tops and all(isinstance(t, float) for t in tops)
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json={**body, "stream": True},
                      headers=AUTH, timeout=60) as resp:
        lines = [ln for ln in resp.iter_lines() if ln.startswith("data: {")]
    # issue 34.11: chunks now carry OpenAI's required nullable keys ("finish_reason": null until the last, and
    # "stop_reason" on it); the check is that no logprob is null
    required = ('"tool_calls":null', '"finish_reason":null', '"stop_reason":null', '"token_ids":null')  # 34: vLLM's
    logprob_lines = "".join(ln for ln in lines if '"top_logprobs"' in ln)
    for key in required:
        logprob_lines = logprob_lines.replace(key, "")
    assert "null" not in logprob_lines
    assert str(LOGPROB_FLOOR) in "".join(lines)


def test_a_slow_body_is_cut_off_with_a_408(server, monkeypatch):
    """F16: a slow body kept a connection open past 35 s."""
    monkeypatch.setattr(_middleware(server), "body_timeout_s", 0.5)
    started = time.monotonic()
    with socket.create_connection((server.state.config.host, server.state.config.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 100\r\n\r\n{")
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 5


def test_slow_headers_are_cut_off(server, monkeypatch):
    """F16: slowloris headers kept a connection open past 35 s."""
    limit = 1.5
    monkeypatch.setattr(server.server.config.http_protocol_class, "header_timeout_s", limit)
    started = time.monotonic()
    with socket.create_connection((server.state.config.host, server.state.config.port), timeout=limit + 20) as s:
        s.sendall(b"GET /health HTTP/1.1\r\n")
        closed = False
        try:
            while not closed and time.monotonic() - started < limit + 15:
                s.sendall(b"X-Drip: 1\r\n")  # a header line now and then, never the blank line
                time.sleep(0.3)
                s.setblocking(False)
                try:
                    closed = s.recv(1) == b""
                except BlockingIOError:
                    pass
                s.setblocking(True)
        except OSError:
            closed = True
    assert closed and time.monotonic() - started < limit + 5


def _middleware(server) -> ServerMiddleware:
    app = server.server.config.loaded_app
    while not isinstance(app, ServerMiddleware):
        app = getattr(app, "middleware_stack", None) or getattr(app, "app", None)
        assert app is not None, "ServerMiddleware not found"
    return app
