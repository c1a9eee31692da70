"""The header deadline on both uvicorn protocols (httptools, h11), on a bare ASGI app: drips cut, slow apps not."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import threading
import time

import pytest
import uvicorn

from servers.openai.launch import free_port
from servers.openai.web import slow_clients
from servers.openai.web.slow_clients import HeaderDeadlineProtocol, event_loop, header_deadline_protocol

LIMIT = 0.6
PROTOCOLS = [pytest.param(False, id="h11"),
             pytest.param(True, id="httptools", marks=pytest.mark.skipif(
                 slow_clients.HttpToolsDeadlineProtocol is None, reason="httptools not installed"))]


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(3 * LIMIT)  # the app may take longer than the header deadline
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(params=PROTOCOLS)
def port(request):
    protocol = header_deadline_protocol(LIMIT, fast=request.param)
    assert issubclass(protocol, slow_clients.HttpToolsDeadlineProtocol if request.param else HeaderDeadlineProtocol)
    config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning", http=protocol,
                            loop=event_loop(), lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield config.port
    server.should_exit = True
    thread.join(timeout=10)


def _closed_within(s: socket.socket, seconds: float) -> bool:
    """Drip a header line every 0.1 s; True once the server closes the connection."""
    deadline = time.monotonic() + seconds
    s.settimeout(0.1)
    while time.monotonic() < deadline:
        try:
            s.sendall(b"X-Drip: 1\r\n")
            if s.recv(1) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


def test_a_header_drip_is_cut_off(port):
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET / HTTP/1.1\r\n")
        assert _closed_within(s, LIMIT + 3)
    assert time.monotonic() - started < LIMIT + 2


def test_a_kept_alive_connection_gets_a_fresh_deadline_after_each_response(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        time.sleep(LIMIT / 2)
        s.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")  # headers in time; the app runs past the deadline
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        s.sendall(b"GET / HTTP/1.1\r\n")  # the next request's headers drip
        assert _closed_within(s, LIMIT + 3)
        assert time.monotonic() - started > LIMIT / 2  # the clock restarted at the response, not at connect


def test_the_fallbacks_without_httptools_or_uvloop(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a))
    assert event_loop() == "asyncio"
    monkeypatch.setattr(slow_clients, "HttpToolsDeadlineProtocol", None)
    protocol = header_deadline_protocol(2.0)
    assert issubclass(protocol, HeaderDeadlineProtocol) and protocol.header_timeout_s == 2.0
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert slow_clients._httptools_protocol() is None


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop not installed")
def test_uvloop_is_taken_when_installed():
    assert event_loop() == "uvloop"
