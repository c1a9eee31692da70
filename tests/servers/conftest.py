"""Server test fixtures: one live server on a random loopback port for the session, and an offline LLM oracle."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from server_cases import API_KEY, CKPT, MAX_MODEL_LEN, MEDIA, NUM_BLOCKS, data_url

from mm_infer.llm import LLM
from servers.openai.config import FetchConfig, ServerConfig
from servers.openai.launch import BackgroundServer, free_port


@pytest.fixture(scope="session")
def server() -> Iterator[BackgroundServer]:
    config = ServerConfig(
        model_dir=str(CKPT), port=free_port(), api_key=API_KEY, max_body_bytes=4 << 20,
        reasoning_parser="think", tool_parser="hermes",
        extra_served_names=("m",),  # the tests name model "m"; an unserved name is a 404 (vLLM's rule)
        fetch=FetchConfig(allowed_media_paths=(MEDIA,), max_bytes=1 << 20),
        allowed_weights_paths=(CKPT.parent, Path(tempfile.gettempdir())),  # refit tests write under tmp_path
        engine_options={"num_kv_blocks": NUM_BLOCKS, "max_model_len": MAX_MODEL_LEN, "batch_invariant": True})
    srv = BackgroundServer(config).start()
    yield srv
    assert srv.state.metrics.running == 0, "a request was never closed"
    srv.stop()
    assert not srv.thread.is_alive(), "the server thread did not stop"


@pytest.fixture(scope="session")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def llm() -> LLM:
    return LLM(str(CKPT), num_kv_blocks=NUM_BLOCKS, max_model_len=MAX_MODEL_LEN, batch_invariant=True)


@pytest.fixture(scope="session")
def photo_url() -> str:
    return data_url(MEDIA / "images" / "photo.png", "image/png")
