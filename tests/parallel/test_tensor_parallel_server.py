"""The server at -tp 2 (its engine core a process with two ranks): an image chat with logprobs through the official
`openai` client equals TP=1; a trainer process's weight transfer fills both ranks (outputs follow HF with the new
weights); a rank killed mid-stream fails that stream with an error naming it, and the core comes back whole."""

from __future__ import annotations

import base64
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from tp_cases import ENGINE, IMAGE, MODELS

from mm_infer import LLM, SamplingParams
from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port

CKPT = MODELS / "tiny-qwen2-vl"
SMALL = 12544


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    config = ServerConfig(model_dir=str(CKPT), port=free_port(), weight_transfer_backend="gloo",
                          engine_core="process", engine_options={**ENGINE, "tensor_parallel_size": 2})
    srv = BackgroundServer(config).start()
    yield srv
    srv.stop()


def _image_messages() -> list[dict]:
    url = f"data:image/jpeg;base64,{base64.b64encode(Path(IMAGE).read_bytes()).decode()}"
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "What is in the picture?"}]}]


def test_image_chat_with_logprobs_through_the_openai_client_equals_tp1(server):
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none")
    reply = client.chat.completions.create(
        model=CKPT.name, messages=_image_messages(), max_tokens=8, temperature=0.0, logprobs=True, top_logprobs=3,
        extra_body={"return_token_ids": True, "min_tokens": 8, "mm_processor_kwargs": {"max_pixels": SMALL}})
    choice = reply.choices[0]
    got = [t.logprob for t in choice.logprobs.content]
    assert len(got) == 8 and all(len(t.top_logprobs) == 3 for t in choice.logprobs.content)
    one = LLM(str(CKPT), **ENGINE)
    prompt = {"messages": [{"role": "user", "content": [{"type": "image"},
                                                       {"type": "text", "text": "What is in the picture?"}]}],
              "multi_modal_data": {"image": [str(IMAGE)]}, "mm_processor_kwargs": {"max_pixels": SMALL}}
    want = one.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8, min_tokens=8, logprobs=0))[0]
    assert choice.model_extra["token_ids"] == list(want.outputs[0].token_ids)
    assert max(abs(a - b) for a, b in zip(got, want.outputs[0].logprobs, strict=True)) <= 1e-5
    info = httpx.get(f"{server.base_url}/server_info").json()
    assert info["vllm_config"]["parallel_config"]["tensor_parallel_size"] == 2


def _core_children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def _backend(server: BackgroundServer):
    return server.state.backend


def test_a_rank_killed_mid_stream_fails_that_stream_and_the_core_comes_back(server):
    backend = _backend(server)
    core = backend.pid
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
    stream = client.completions.create(model=CKPT.name, prompt="long", max_tokens=400, temperature=0.0, stream=True,
                                       extra_body={"min_tokens": 400})
    with pytest.raises(openai.APIError) as info:  # the stream ends in an error event naming the lost rank
        for i, _ in enumerate(stream):
            if i == 2:
                os.kill(_core_children(core)[0], signal.SIGKILL)
    assert isinstance(info.value, openai.APIError) and "tensor-parallel rank is gone" in str(info.value)
    deadline = time.monotonic() + 120
    while not (backend.is_alive and backend.pid != core) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert backend.pid != core and backend.restarts >= 1
    again = client.completions.create(model=CKPT.name, prompt="again", max_tokens=3, temperature=0.0)
    assert again.choices[0].finish_reason == "length"
