"""--reasoning-parser qwen3 on a thinking copy of tiny Qwen3.5 (its template opens <think> after the assistant tag):
with an image, the reasoning and the content split at the model's own </think>, the ids equal to the offline LLM's."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from script_modules import load_script
from server_cases import MEDIA, REPO, data_url

from mm_infer import LLM, SamplingParams
from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port

QWEN35 = REPO / "assets" / "models" / "tiny-qwen3.5"
THINK, END_THINK = 3008, 3009  # the ids the thinking copy gives <think> and </think>
OPTIONS = {"num_kv_blocks": 128, "max_model_len": 1024, "batch_invariant": True, "cpu_threads": 1}
GRAY = MEDIA / "images" / "gray.png"


@pytest.fixture(scope="module")
def thinking(tmp_path_factory) -> Iterator[tuple[httpx.Client, LLM]]:
    make = load_script("assets.thinking_checkpoint").thinking_checkpoint
    ckpt = make(QWEN35, tmp_path_factory.mktemp("thinking") / "tiny-qwen3.5-thinking")
    template = (ckpt / "chat_template.jinja").read_text()
    opened = "<|im_start|>assistant\n<think>\n{% endif %}"
    (ckpt / "chat_template.jinja").write_text(template.replace("<|im_start|>assistant\n{% endif %}", opened))
    assert opened in (ckpt / "chat_template.jinja").read_text()
    config = ServerConfig(model_dir=str(ckpt), port=free_port(), reasoning_parser="qwen3", engine_options=OPTIONS)
    with BackgroundServer(config) as srv, httpx.Client(base_url=srv.base_url, timeout=120) as client:
        yield client, LLM(str(ckpt), **OPTIONS)


def _chat(client: httpx.Client, **body) -> dict:
    content = [{"type": "image_url", "image_url": {"url": data_url(GRAY, "image/png")}},
               {"type": "text", "text": "Colour?"}]
    r = client.post("/v1/chat/completions", json={"model": "tiny-qwen3.5-thinking", "temperature": 0.0,
                                                  "messages": [{"role": "user", "content": content}],
                                                  "return_token_ids": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_an_unclosed_thought_is_all_reasoning(thinking):
    client, llm = thinking
    out = _chat(client, max_tokens=6)
    prompt, choice = out["prompt_token_ids"], out["choices"][0]
    assert prompt[-2:] == [THINK, llm.get_tokenizer().encode("\n")[0]] and 3006 in prompt  # opened, image expanded
    ref = llm.generate({"prompt_token_ids": prompt, "multi_modal_data": {"image": [GRAY]}},
                       SamplingParams(temperature=0.0, max_tokens=6), use_tqdm=False)[0].outputs[0]
    assert choice["token_ids"] == ref.token_ids and END_THINK not in ref.token_ids
    assert choice["message"]["reasoning"] == ref.text and choice["message"]["content"] is None


def test_the_models_end_tag_closes_the_thought(thinking):
    # the bias makes the model write </think> at once: an empty reasoning (null) and the rest content, as the
    # qwen3 parser splits the offline LLM's text
    from servers.openai.answers.parsers import build_output_parser

    client, llm = thinking
    out = _chat(client, max_tokens=3, logit_bias={str(END_THINK): 100})
    choice = out["choices"][0]
    ref = llm.generate({"prompt_token_ids": out["prompt_token_ids"], "multi_modal_data": {"image": [GRAY]}},
                       SamplingParams(temperature=0.0, max_tokens=3, logit_bias={END_THINK: 100}),
                       use_tqdm=False)[0].outputs[0]
    assert choice["token_ids"] == ref.token_ids == [END_THINK] * 3
    want = build_output_parser("qwen3", None).parse(ref.text, opened=True)
    assert (choice["message"]["reasoning"], choice["message"]["content"]) == (want.reasoning_content, want.content)
    assert want.reasoning_content is None and want.content == "</think></think>"
