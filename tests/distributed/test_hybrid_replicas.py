"""A server over 2 Ray replicas of a hybrid tiny model (Nemotron Omni's Mamba-2, Qwen3.5-MoE's gated DeltaNet: a
recurrent-state slot per sequence) answers an image chat exactly as one local engine on the same checkpoint does."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from replica_cases import ROOT

from mm_infer import LLM, SamplingParams

HYBRID = {"nemotron-omni": (ROOT / "assets" / "models" / "tiny-nemotron-omni", 3003),  # <image>
          "qwen3.5-moe": (ROOT / "assets" / "models" / "tiny-qwen3.5-moe", 3006)}  # <|image_pad|>
PHOTO = ROOT / "assets" / "media" / "images" / "photo.png"
OPTIONS = {"num_kv_blocks": 128, "max_model_len": 1024, "cpu_threads": 1, "batch_invariant": True}


@pytest.fixture(scope="module", params=sorted(HYBRID))
def hybrid(request) -> tuple[Path, int]:  # noqa: ANN001
    return HYBRID[request.param]


@pytest.fixture(scope="module")
def pool_server(local_ray: None, hybrid: tuple[Path, int]) -> Iterator[str]:
    from servers.openai.config import ServerConfig
    from servers.openai.launch import BackgroundServer, free_port

    srv = BackgroundServer(ServerConfig(model_dir=str(hybrid[0]), port=free_port(), replicas=2,
                                        engine_options=OPTIONS)).start()
    yield srv.base_url
    srv.stop()


def test_image_chat_through_two_replicas_equals_the_local_engine(pool_server: str, hybrid: tuple[Path, int]) -> None:
    ckpt, image_token = hybrid
    assert "mm_infer_replicas_up 2" in httpx.get(f"{pool_server}/metrics").text
    url = "data:image/png;base64," + base64.b64encode(PHOTO.read_bytes()).decode()
    client = openai.OpenAI(base_url=f"{pool_server}/v1", api_key="none", max_retries=0, timeout=120)
    r = client.chat.completions.create(
        model=ckpt.name, max_tokens=6, temperature=0.0, logprobs=True, extra_body={"return_token_ids": True},
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                               {"type": "text", "text": "What is it?"}]}])
    threads = torch.get_num_threads()
    prompt = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}],
              "multi_modal_data": {"image": [PHOTO]}}
    ref = LLM(str(ckpt), **OPTIONS).generate(prompt, SamplingParams(temperature=0.0, max_tokens=6, logprobs=0),
                                             use_tqdm=False)[0]
    torch.set_num_threads(threads)
    assert r.model_extra["prompt_token_ids"] == ref.prompt_token_ids and image_token in ref.prompt_token_ids
    assert r.choices[0].model_extra["token_ids"] == ref.outputs[0].token_ids
    got = [t.logprob for t in r.choices[0].logprobs.content]
    assert max(abs(a - b) for a, b in zip(got, ref.outputs[0].logprobs, strict=True)) <= 1e-5
