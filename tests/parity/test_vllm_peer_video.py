"""Video parity with vLLM's CPU build: every parity video (four codecs, 2 to 30 fps) gives vLLM's prompt ids, greedy
ids and logprobs. After a long video (temporal grid > h/merge) vLLM resumes text at max + 1: our
mrope_after_video="vllm" equals it there and our default (transformers 5's rule) does not. Skipped without the peer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from parity_cases import CKPT, REPO
from peer_cases import needs_peer, vllm_peer

from servers.openai.config import FetchConfig, ServerConfig
from servers.openai.launch import BackgroundServer, free_port

pytestmark = needs_peer

VIDEOS = REPO / "assets" / "media" / "videos"
NAMES = sorted(p.name for p in VIDEOS.iterdir())
LONG = {"long_h264_2fps_80.mp4", "pan_h264_2fps_59.mp4"}  # temporal grid 40 and 30 against h/merge 2 and 4


@pytest.fixture(scope="module")
def vllm_base() -> Iterator[str]:
    with vllm_peer(CKPT, "--allowed-local-media-path", str(VIDEOS), "--max-num-seqs", "4",
                   "--trust-request-mm-kwargs", max_model_len=4096) as base:
        yield base


def _ours(rule: str) -> BackgroundServer:
    config = ServerConfig(model_dir=str(CKPT), port=free_port(), fetch=FetchConfig(allowed_media_paths=(VIDEOS,)),
                          engine_options={"num_kv_blocks": 512, "max_model_len": 4096, "mrope_after_video": rule})
    return BackgroundServer(config).start()


@pytest.fixture(scope="module")
def ours() -> Iterator[dict[str, str]]:
    servers = {rule: _ours(rule) for rule in ("hf", "vllm")}
    yield {rule: srv.base_url for rule, srv in servers.items()}
    for srv in servers.values():
        srv.stop()


def _ask(base: str, name: str, ckpt: Path = CKPT, **extra: Any) -> tuple[list[int], list[int], list[float]]:
    body = {"model": str(ckpt), "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": f"file://{VIDEOS / name}"}},
        {"type": "text", "text": "What happens?"}]}],
        "max_tokens": 8, "temperature": 0, "logprobs": True, "return_token_ids": True, **extra}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return r.json()["prompt_token_ids"], choice["token_ids"], [c["logprob"] for c in choice["logprobs"]["content"]]


def _same(a: tuple, b: tuple, tol: float = 1e-4) -> None:
    assert a[0] == b[0], "prompt ids differ"
    assert a[1] == b[1], "greedy ids differ"
    assert max(abs(x - y) for x, y in zip(a[2], b[2], strict=True)) < tol


@pytest.mark.parametrize("name", NAMES)
def test_default_equals_vllm(vllm_base: str, ours: dict[str, str], name: str) -> None:
    theirs = _ask(vllm_base, name)
    _same(_ask(ours["vllm"], name), theirs)
    if name not in LONG:
        _same(_ask(ours["hf"], name), theirs)
    else:
        default = _ask(ours["hf"], name)
        assert default[0] == theirs[0]  # the same frames and ids: only the positions after the video differ
        assert max(abs(x - y) for x, y in zip(default[2], theirs[2], strict=False)) > 1e-3


@pytest.mark.parametrize("name", ["pan_h264_30fps.mp4", "pan_vp8_12fps.webm", "long_h264_2fps_80.mp4"])
def test_media_io_fps_equals_vllm(vllm_base: str, ours: dict[str, str], name: str) -> None:
    extra = {"media_io_kwargs": {"video": {"fps": 1}}}
    _same(_ask(ours["vllm"], name, **extra), _ask(vllm_base, name, **extra))


CKPT25 = REPO / "assets" / "models" / "tiny-qwen2.5-vl"
FRACTIONAL = ["odd7_h264_2fps.mp4", "pan_h264_30fps.mp4", "pan_mpeg4_2997fps.mp4", "pan_vp8_12fps.webm"]


@pytest.fixture(scope="module")
def qwen25() -> Iterator[tuple[str, str]]:
    """(vLLM, ours with vLLM's M-RoPE rule) on tiny-qwen2.5-vl, whose M-RoPE scales video time by
    second_per_grid_ts * tokens_per_second: its temporal ids outrun max(h, w)/merge on most clips, so the two rules
    differ there (pan_vp8_12fps: t ids 0..6 against h/w ids 0..4)."""
    config = ServerConfig(model_dir=str(CKPT25), port=free_port(), fetch=FetchConfig(allowed_media_paths=(VIDEOS,)),
                          engine_options={"num_kv_blocks": 512, "max_model_len": 4096, "mrope_after_video": "vllm"})
    with vllm_peer(CKPT25, "--allowed-local-media-path", str(VIDEOS), "--max-num-seqs", "4",
                   max_model_len=4096) as theirs, BackgroundServer(config) as ours:
        yield theirs, ours.base_url


@pytest.mark.parametrize("name", FRACTIONAL)
def test_qwen25_second_per_grid_ts_equals_vllm(qwen25: tuple[str, str], name: str) -> None:
    # seconds per temporal patch 1.1667, 1.1111, 1.001, 1.0417: t ids = floor(k * that * tokens_per_second)
    theirs, ours = qwen25
    _same(_ask(ours, name, CKPT25), _ask(theirs, name, CKPT25))
