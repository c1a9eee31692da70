"""The OpenAI server over an engine core process: the official client, /health and /metrics, a core killed under it."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import openai
import pytest
from test_core_process import CKPT, IMAGE, OPTIONS, wait_up

from mm_infer.engine_core import CoreProcessBackend
from servers.cli import build_parser, server_config
from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    config = ServerConfig(model_dir=str(CKPT), port=free_port(), engine_options=OPTIONS, engine_core="process")
    srv = BackgroundServer(config).start()
    assert isinstance(srv.state.backend, CoreProcessBackend)
    yield srv
    srv.stop()


def client_of(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_cli_runs_the_core_in_its_own_process_by_default():
    assert server_config(build_parser().parse_args(["serve", str(CKPT)])).engine_core == "process"
    assert server_config(build_parser().parse_args(["serve", str(CKPT), "--engine-core", "thread"])).engine_core \
        == "thread"


def test_the_openai_client_streams_an_image_answer_with_token_ids(server):
    url = "data:image/png;base64," + base64.b64encode(sorted(IMAGE.glob("*.png"))[0].read_bytes()).decode()
    chunks = list(client_of(server).chat.completions.create(
        model=CKPT.name, stream=True, max_tokens=8, temperature=0.0,
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                               {"type": "text", "text": "what is it"}]}],
        extra_body={"ignore_eos": True, "return_token_ids": True}))
    ids = [t for c in chunks for t in (getattr(c.choices[0], "token_ids", None) or []) if c.choices]
    assert len(ids) == 8
    assert chunks[-1].choices == [] or chunks[-1].choices[0].finish_reason == "length"


def test_metrics_read_the_core_gauges(server):
    client_of(server).completions.create(model=CKPT.name, prompt="hi", max_tokens=2)
    text = httpx.get(f"{server.base_url}/metrics").text
    assert "mm_infer_kv_blocks_total 128" in text.replace(".0", "")
    assert "mm_infer_engine_core_restarts" in text


def test_a_core_killed_mid_stream_ends_that_stream_and_health_recovers(server):
    backend = server.state.backend
    assert isinstance(backend, CoreProcessBackend)
    pid = backend.pid
    stream = client_of(server).chat.completions.create(
        model=CKPT.name, stream=True, max_tokens=400, temperature=0.0, extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": "count to a thousand"}])
    with pytest.raises(openai.APIError, match="engine core process"):
        for i, _ in enumerate(stream):
            if i == 2:
                backend.kill_core()
    wait_up(backend, pid)
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    out = client_of(server).completions.create(model=CKPT.name, prompt="alive", max_tokens=3)
    assert out.choices[0].finish_reason in ("length", "stop")
