"""Qwen2.5-VL video through the server equals LLM.generate (M-RoPE needs each video's second_per_grid_t)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from server_cases import MEDIA, REPO, SMALL, data_url

from mm_infer import LLM, SamplingParams
from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port

CKPT25 = REPO / "assets" / "models" / "tiny-qwen2.5-vl"
VIDEO = MEDIA / "videos" / "pan_mpeg4_5fps.avi"  # at fps 1: two temporal grids, 2 s apart
KW = {"video_max_pixels": SMALL, "fps": 1.0}


@pytest.fixture(scope="module")
def server25() -> Iterator[BackgroundServer]:
    config = ServerConfig(model_dir=str(CKPT25), port=free_port(), engine_options={"num_kv_blocks": 128},
                          extra_served_names=("m",))  # the requests name "m": an unserved name is a 404
    with BackgroundServer(config) as srv:
        yield srv


def test_video_matches_llm_generate(server25):
    client = openai.OpenAI(base_url=f"{server25.base_url}/v1", api_key="none", max_retries=0)
    content = [{"type": "video_url", "video_url": {"url": data_url(VIDEO, "video/x-msvideo")}},
               {"type": "text", "text": "What moves?"}]
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], max_tokens=5,
                                       temperature=0.0,
                                       extra_body={"return_token_ids": True, "mm_processor_kwargs": KW})
    ref = LLM(str(CKPT25), num_kv_blocks=128).generate(
        {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What moves?"}]}],
         "multi_modal_data": {"video": [VIDEO]}, "mm_processor_kwargs": KW},
        SamplingParams(temperature=0.0, max_tokens=5), use_tqdm=False)[0]
    assert r.model_extra["prompt_token_ids"] == ref.prompt_token_ids
    assert r.choices[0].model_extra["token_ids"] == ref.outputs[0].token_ids
    lps = r.choices[0].message.model_extra["generation_log_probs"]
    assert max(abs(a - b) for a, b in zip(lps, ref.outputs[0].logprobs, strict=True)) < 1e-5
