"""vLLM-style server settings: generation_config defaults, a server-wide chat template, extra served names and
limit_mm_per_prompt, on a server of their own."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_cases import API_KEY, CKPT, SMALL

from servers.openai.bodies.generation_defaults import load_generation_defaults, log_generation_defaults
from servers.openai.bodies.requests import ChatCompletionRequest, CompletionRequest
from servers.openai.bodies.sampling_params import to_sampling_params
from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port

AUTH = {"Authorization": f"Bearer {API_KEY}"}
TEMPLATE = "{% for m in messages %}S:{{ m.content }};{% endfor %}"
GENERATION = {"temperature": 0.0, "top_k": 5, "max_new_tokens": 3, "do_sample": True, "bos_token_id": 3000}


@pytest.fixture(scope="module")
def gen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("generation")
    (folder / "generation_config.json").write_text(json.dumps(GENERATION))
    return folder


@pytest.fixture(scope="module")
def vsrv(gen_dir: Path) -> Iterator[BackgroundServer]:
    config = ServerConfig(model_dir=str(CKPT), port=free_port(), api_key=API_KEY, generation_config=str(gen_dir),
                          chat_template=TEMPLATE, extra_served_names=("alias-a", "alias-b"),
                          limit_mm_per_prompt={"image": 1, "video": 0},
                          engine_options={"num_kv_blocks": 64, "max_model_len": 512})
    with BackgroundServer(config) as srv:
        yield srv


def chat(srv: BackgroundServer, **kw) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": "hi"}], "ignore_eos": True, "return_token_ids": True, **kw}
    return httpx.post(f"{srv.base_url}/v1/chat/completions", json=body, headers=AUTH, timeout=120)


def test_generation_config_values(gen_dir):
    assert load_generation_defaults("vllm", CKPT) == {}
    assert load_generation_defaults("auto", CKPT) == {}  # the tiny checkpoints declare no sampling defaults
    assert load_generation_defaults(str(gen_dir), CKPT) == {"temperature": 0.0, "top_k": 5, "max_tokens": 3}
    with pytest.raises(ValueError, match="does not exist"):
        load_generation_defaults(str(gen_dir / "nowhere"), CKPT)
    (gen_dir / "bad").mkdir()
    (gen_dir / "bad" / "generation_config.json").write_text(json.dumps({"top_p": 0.0}))
    with pytest.raises(ValueError, match="top_p"):
        load_generation_defaults(str(gen_dir / "bad"), CKPT)


def test_defaults_fill_only_what_the_request_leaves_out():
    defaults = {"temperature": 0.3, "top_p": 0.9, "repetition_penalty": 1.05, "max_tokens": 64}
    chat_req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], temperature=1.0, max_tokens=100)
    p = to_sampling_params(chat_req, 3008, defaults)
    assert (p.temperature, p.top_p, p.repetition_penalty, p.top_k, p.max_tokens) == (1.0, 0.9, 1.05, 0, 64)
    p = to_sampling_params(CompletionRequest(prompt="x"), 3008, defaults)
    assert (p.temperature, p.max_tokens) == (0.3, 16)  # completions' own default 16 is under the cap
    assert to_sampling_params(CompletionRequest(prompt="x", top_p=0.5), 3008, {}).top_p == 0.5


def test_startup_log_names_the_defaults(caplog):
    with caplog.at_level(logging.INFO, logger="mm_infer.server"):
        log_generation_defaults("auto", {"temperature": 0.7})
        log_generation_defaults("vllm", {})
    assert "temperature': 0.7" in caplog.records[0].getMessage() and caplog.records[0].levelno == logging.WARNING
    assert "no generation_config sampling defaults" in caplog.records[1].getMessage()


def test_generation_defaults_apply_to_requests(vsrv):
    runs = [chat(vsrv, seed=s).json()["choices"][0] for s in (1, 2)]
    greedy = chat(vsrv, temperature=0.0, max_tokens=3).json()["choices"][0]
    assert runs[0]["token_ids"] == runs[1]["token_ids"] == greedy["token_ids"]  # temperature 0 from the config
    assert len(runs[0]["token_ids"]) == 3 and runs[0]["finish_reason"] == "length"  # max_new_tokens
    assert len(chat(vsrv, max_tokens=10).json()["choices"][0]["token_ids"]) == 3  # vLLM: the config caps it


def test_server_chat_template_and_the_request_override(vsrv):
    tok = vsrv.state.preparer.tokenizer
    assert chat(vsrv, max_tokens=1).json()["prompt_token_ids"] == tok.encode("S:hi;", add_special_tokens=False)
    own = "{% for m in messages %}R:{{ m.content }}{% endfor %}"
    r = chat(vsrv, max_tokens=1, chat_template=own)
    assert r.json()["prompt_token_ids"] == tok.encode("R:hi", add_special_tokens=False)


def test_models_lists_every_served_name(vsrv):
    names = [m["id"] for m in httpx.get(f"{vsrv.base_url}/v1/models", headers=AUTH).json()["data"]]
    assert names == [CKPT.name, "alias-a", "alias-b"]


def test_limit_mm_per_prompt(vsrv, photo_url):
    image = {"type": "image_url", "image_url": {"url": photo_url}}
    one = chat(vsrv, max_tokens=1, messages=[{"role": "user", "content": [image, {"type": "text", "text": "x"}]}],
               mm_processor_kwargs={"max_pixels": SMALL},
               chat_template=vsrv.state.preparer.tokenizer.chat_template)  # the server's renders no media
    assert one.status_code == 200, one.text
    for content, words in (([image, image], "at most 1 image"),
                           ([{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}],
                            "at most 0 video")):
        r = chat(vsrv, max_tokens=1, messages=[{"role": "user", "content": content}])
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
