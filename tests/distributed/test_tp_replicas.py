"""--replicas 2 with -tp 2: two Ray replicas of two ranks each (each replica's rank 0 starts its other rank, on
the cores the replica reserved); both replicas answer an image chat as one local TP=1 engine does."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import httpx
import openai
import pytest
import torch
from replica_cases import ROOT

from mm_infer import LLM, SamplingParams

CKPT = ROOT / "assets" / "models" / "tiny-qwen2-vl"
PHOTO = ROOT / "assets" / "media" / "images" / "photo.png"
OPTIONS = {"num_kv_blocks": 96, "max_model_len": 1024}


@pytest.fixture(scope="module")
def pool_server(local_ray: None) -> Iterator[str]:
    from servers.openai.config import ServerConfig
    from servers.openai.launch import BackgroundServer, free_port

    srv = BackgroundServer(ServerConfig(model_dir=str(CKPT), port=free_port(), replicas=2,
                                        engine_options={**OPTIONS, "tensor_parallel_size": 2})).start()
    yield srv.base_url
    srv.stop()


def test_two_replicas_of_two_ranks_each_answer_as_the_local_engine(pool_server: str) -> None:
    assert "mm_infer_replicas_up 2" in httpx.get(f"{pool_server}/metrics").text
    url = "data:image/png;base64," + base64.b64encode(PHOTO.read_bytes()).decode()
    client = openai.OpenAI(base_url=f"{pool_server}/v1", api_key="none", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                             {"type": "text", "text": "What is it?"}]}]
    replies = [client.chat.completions.create(model=CKPT.name, max_tokens=6, temperature=0.0, logprobs=True,
                                              messages=messages, extra_body={"return_token_ids": True})
               for _ in range(4)]  # the router spreads them over both replicas
    threads = torch.get_num_threads()
    prompt = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}],
              "multi_modal_data": {"image": [PHOTO]}}
    ref = LLM(str(CKPT), **OPTIONS, cpu_threads=1).generate(
        prompt, SamplingParams(temperature=0.0, max_tokens=6, logprobs=0), use_tqdm=False)[0]
    torch.set_num_threads(threads)
    for r in replies:
        assert r.choices[0].model_extra["token_ids"] == ref.outputs[0].token_ids
        got = [t.logprob for t in r.choices[0].logprobs.content]
        assert max(abs(a - b) for a, b in zip(got, ref.outputs[0].logprobs, strict=True)) <= 1e-5
