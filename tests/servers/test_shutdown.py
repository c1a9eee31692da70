"""SIGTERM drains: new requests get 503, in-flight ones get --shutdown-timeout to finish, then a proper error."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest
from serve_process import start_serve
from server_cases import CKPT

from servers.openai.launch import free_port

AUTH = {"Authorization": "Bearer k"}


def _stream(base: str, body: dict, events: list[str], started: threading.Event) -> None:
    with httpx.stream("POST", f"{base}/v1/completions", json={**body, "stream": True}, headers=AUTH,
                      timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line)
                started.set()


def test_sigterm_refuses_new_requests_lets_short_ones_finish_and_ends_long_streams_properly():
    """F10: SIGTERM drained for a fixed 5 s; then plain-text 500s and streams cut with no error event or [DONE]."""
    proc, base = start_serve([str(CKPT), "--api-key", "k", "--max-model-len", "4096", "--num-kv-blocks", "300",
                              "--shutdown-timeout", "3"], free_port(), timeout_s=120)
    try:
        events: list[str] = []
        started = threading.Event()
        endless = {"prompt": "count", "max_tokens": 4000, "min_tokens": 4000, "temperature": 0}
        worker = threading.Thread(target=_stream, args=(base, endless, events, started))
        worker.start()
        assert started.wait(60), "the long stream never started"
        client = httpx.Client(base_url=base, headers=AUTH, timeout=60)
        assert client.get("/v1/models").status_code == 200  # a kept-alive connection, open before SIGTERM
        short = {"prompt": "short", "max_tokens": 30, "min_tokens": 30, "temperature": 0}
        finishing: list[str] = []
        short_started = threading.Event()
        in_flight = threading.Thread(target=_stream, args=(base, short, finishing, short_started))
        in_flight.start()
        assert short_started.wait(60), "the short stream never started"
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        refused = httpx.post(f"{base}/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=AUTH)
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
        assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 503
        assert httpx.get(f"{base}/health").status_code == 503
        in_flight.join(timeout=60)
        assert finishing[-1] == "data: [DONE]" and '"finish_reason":"length"' in finishing[-2]  # finished in time
        worker.join(timeout=60)
        assert not worker.is_alive()
        error = json.loads(events[-2].removeprefix("data: "))
        assert events[-1] == "data: [DONE]" and error["error"]["code"] == 503
        assert "shutting down" in error["error"]["message"]
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (0, -signal.SIGTERM)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_whole_process_group_drains_and_exits(sig):
    """Ctrl-C (SIGINT) and `kill -- -PGID` reach the engine core and the template workers too. Before, the core died
    of it: the in-flight request was lost, the server restarted the core while shutting down, and never exited."""
    proc, base = start_serve([str(CKPT), "--api-key", "k", "--shutdown-timeout", "20",
                              "--trust-request-chat-template"], free_port(), timeout_s=120,
                             own_group=True)
    try:
        template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # a request template: a worker is running
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "min_tokens": 40,
                "temperature": 0, "chat_template": template}
        assert httpx.post(f"{base}/v1/chat/completions", json=body, headers=AUTH, timeout=60).status_code == 200
        events: list[str] = []
        started = threading.Event()
        in_flight = threading.Thread(target=_stream, args=(base, {"prompt": "a", "max_tokens": 60, "min_tokens": 60,
                                                                  "temperature": 0}, events, started))
        in_flight.start()
        assert started.wait(60), "the stream never started"
        os.killpg(proc.pid, sig)
        in_flight.join(timeout=60)
        assert events[-1] == "data: [DONE]" and '"finish_reason":"length"' in events[-2]  # it finished
        proc.wait(timeout=40)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = proc.stdout.read().decode()
    assert "restart" not in log, log[-2000:]
    assert proc.returncode in (0, -sig), log[-2000:]
