"""The OpenAI server on tiny Qwen3-VL: chat with an image and a video equals the offline LLM (timestamps included)."""

from __future__ import annotations

import base64

import openai
import pytest
from model_cases import REPO
from qwen3_cases import QWEN3

from mm_infer import LLM, SamplingParams

MEDIA = REPO / "assets" / "media"
KEY = "k"


def _url(path, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


@pytest.fixture(scope="module")
def served():
    from servers.openai.config import ServerConfig
    from servers.openai.launch import BackgroundServer, free_port

    options = {"num_kv_blocks": 256, "max_model_len": 2048}
    srv = BackgroundServer(ServerConfig(model_dir=str(QWEN3["qwen3_vl"]), port=free_port(), api_key=KEY,
                                        max_body_bytes=4 << 20, engine_options=options)).start()
    yield openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=KEY, max_retries=0, timeout=120), LLM(
        str(QWEN3["qwen3_vl"]), **options)
    srv.stop()


def test_chat_with_image_and_video_equals_llm(served):
    client, llm = served
    image, video = MEDIA / "images" / "photo.png", MEDIA / "videos" / "pan_vp9_10fps.webm"
    content = [{"type": "image_url", "image_url": {"url": _url(image, "image/png")}},
               {"type": "video_url", "video_url": {"url": _url(video, "video/webm")}},
               {"type": "text", "text": "What moves?"}]
    r = client.chat.completions.create(model=QWEN3["qwen3_vl"].name, messages=[{"role": "user", "content": content}],
                                       max_tokens=6, temperature=0.0, logprobs=True,
                                       extra_body={"return_token_ids": True})
    parts = [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "What moves?"}]
    ref = llm.generate({"messages": [{"role": "user", "content": parts}],
                        "multi_modal_data": {"image": [image], "video": [video]}},
                       SamplingParams(temperature=0.0, max_tokens=6, logprobs=0), use_tqdm=False)[0]
    assert r.model_extra["prompt_token_ids"] == ref.prompt_token_ids
    assert "seconds>" in llm.get_tokenizer().decode(ref.prompt_token_ids)
    assert r.choices[0].model_extra["token_ids"] == ref.outputs[0].token_ids
    lps = [t.logprob for t in r.choices[0].logprobs.content]
    assert max(abs(a - b) for a, b in zip(lps, ref.outputs[0].logprobs, strict=True)) < 1e-5
