"""Render then generate equals chat for the other families' videos: Qwen2.5-VL (second_per_grid_t in M-RoPE) and
Qwen3-VL (a "<t seconds>" run per temporal patch, one placeholder span per video), by reference and inline."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from server_cases import MEDIA, REPO, SMALL, data_url

from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port

VIDEO = MEDIA / "videos" / "pan_mpeg4_5fps.avi"  # at fps 1: two temporal grids, 2 s apart
KW = {"video_max_pixels": SMALL, "max_pixels": SMALL, "fps": 1.0}


@pytest.fixture(scope="module", params=["tiny-qwen2.5-vl", "tiny-qwen3-vl"])
def family(request) -> Iterator[BackgroundServer]:
    config = ServerConfig(model_dir=str(REPO / "assets" / "models" / request.param), port=free_port(),
                          engine_options={"num_kv_blocks": 128, "batch_invariant": True})
    with BackgroundServer(config) as srv:
        yield srv


def _post(srv: BackgroundServer, path: str, body: dict) -> dict:
    r = httpx.post(f"{srv.base_url}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("payload", [None, "tensors"])
def test_video_render_then_generate_equals_chat(family, payload):
    content = [{"type": "image_url", "image_url": {"url": data_url(MEDIA / "images" / "photo.png", "image/png")}},
               {"type": "video_url", "video_url": {"url": data_url(VIDEO, "video/x-msvideo")}},
               {"type": "text", "text": "What moves?"}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 5, "temperature": 0.7, "seed": 3,
            "n": 2, "return_token_ids": True, "logprobs": True, "mm_processor_kwargs": KW}
    chat = _post(family, "/v1/chat/completions", body)
    rendered = _post(family, "/v1/chat/completions/render", {**body, "mm_payload": payload})
    assert rendered["token_ids"] == chat["prompt_token_ids"]
    (video,) = rendered["features"]["mm_items"]["video"]
    assert video["second_per_grid_t"] == chat["prompt_media"][1]["second_per_grid_t"] is not None
    (span,) = rendered["features"]["mm_placeholders"]["video"]
    pads = [i for i, t in enumerate(rendered["token_ids"]) if t == rendered["token_ids"][span["offset"]]]
    assert (pads[0], pads[-1] + 1) == (span["offset"], span["offset"] + span["length"])  # first pad to last
    if payload is not None:
        family.state.features.clear()  # inline: nothing needed from the cache
    gen = _post(family, "/inference/v1/generate", rendered)
    assert [c["token_ids"] for c in gen["choices"]] == [c["token_ids"] for c in chat["choices"]]
    assert [[e["logprob"] for e in c["logprobs"]["content"]] for c in gen["choices"]] == \
        [c["message"]["generation_log_probs"] for c in chat["choices"]]
