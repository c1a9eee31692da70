"""Parity fixtures: two live mm-infer servers, HF reference servers with options, and scripts/peers/parity.py loaded."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
from parity_cases import CKPT
from script_modules import load_script

from servers.hf_reference.app import Options
from servers.hf_reference.launch import ThreadServer
from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port


@pytest.fixture(scope="session")
def parity() -> ModuleType:
    return load_script("peers.parity")


def _ours() -> BackgroundServer:
    config = ServerConfig(model_dir=str(CKPT), port=free_port(),
                          engine_options={"num_kv_blocks": 128, "max_model_len": 1024})
    return BackgroundServer(config).start()


@pytest.fixture(scope="session")
def ours() -> Iterator[BackgroundServer]:
    srv = _ours()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def ours_again() -> Iterator[BackgroundServer]:
    srv = _ours()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def hf_without_ids() -> Iterator[ThreadServer]:
    """The HF reference acting as a plain OpenAI server: no token id fields, logprobs kept."""
    with ThreadServer(str(CKPT), Options(token_ids=False)) as srv:
        yield srv


@pytest.fixture(scope="session")
def hf_bare() -> Iterator[ThreadServer]:
    """The HF reference with neither token ids nor logprobs, refusing video (vLLM's limit of 0 videos)."""
    with ThreadServer(str(CKPT), Options(token_ids=False, logprobs=False, max_videos=0)) as srv:
        yield srv


@pytest.fixture(scope="session")
def hf_full() -> Iterator[ThreadServer]:
    """The HF reference with every extension on, in this process."""
    with ThreadServer(str(CKPT)) as srv:
        yield srv
