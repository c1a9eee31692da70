"""Issue 32 (2): a request's own chat_template renders in a killable worker with a deadline and an output cap, on
the pool's own threads; the rendered text is measured before anyone tokenizes it. Nobody else waits on it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_cases import API_KEY, CKPT

from mm_infer.prompt.template_workers import TemplateLimits
from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port
from servers.openai.prompting.admission import text_char_limit

MODEL = "tiny-qwen2-vl"
TIMEOUT_S = 3.0  # the template deadline here (the default is 5 s)
MAX_MODEL_LEN = 1024
BOMB = "{{ 'a' * 100000000 }}"
LOOPS = ("{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}{% endfor %}"
         "{% endfor %}{% endfor %}")
HOSTILE = 8  # more than the default executor's threads (min(32, cores + 4) = 6 on two cores)
WAIT_S = 60.0  # the most a request here may take: a hang fails the test, it never passes it


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    config = ServerConfig(model_dir=str(CKPT), port=free_port(), api_key=API_KEY,
                          templates=TemplateLimits(workers=2, timeout_s=TIMEOUT_S),
                          engine_options={"num_kv_blocks": 128, "max_model_len": MAX_MODEL_LEN,
                                          "max_grammar_bytes": 8192})
    with BackgroundServer(config) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=WAIT_S) as client:
        yield client


def chat(http: httpx.Client, **body) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0.0,
            **body}
    return http.post("/v1/chat/completions", json=body)


def cap(server) -> int:
    return text_char_limit(server.state.preparer.tokenizer, MAX_MODEL_LEN)


def test_a_template_bomb_is_a_prompt_400(server, http):
    # the bug: no answer in 60 s, RSS 11.8 GB (jinja folded the 100 MB string, then it was tokenized)
    start = time.monotonic()
    r = chat(http, chat_template=BOMB)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert f"over the cap of {cap(server)} characters" in error["message"] and error["param"] == "chat_template"
    assert time.monotonic() - start < TIMEOUT_S  # refused by the sandbox's cap at once, not by the deadline


def test_a_template_sent_in_chat_template_kwargs_is_the_requests_too(server, http):
    # a template under chat_template_kwargs rendered in process, outside any bound
    r = chat(http, chat_template_kwargs={"chat_template": BOMB})
    assert r.status_code == 400 and "over the cap" in r.json()["error"]["message"], r.text


def test_runaway_loops_time_out_and_nobody_else_waits(server, http):
    # the bug: triple-nested range loops spun forever; seven of them filled the default executor and then every
    # chat and /tokenize hung while /health said 200
    answered: list[float] = []
    lock = threading.Lock()

    def hostile() -> httpx.Response:
        r = chat(http, chat_template=LOOPS)
        with lock:
            answered.append(time.monotonic())
        return r

    with ThreadPoolExecutor(HOSTILE) as pool:
        futures = [pool.submit(hostile) for _ in range(HOSTILE)]
        time.sleep(0.5)  # every hostile request is in flight (rendering or queued for a worker)
        innocent = chat(http)
        tokenized = http.post("/tokenize", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        done_at = time.monotonic()
        with lock:
            early = list(answered)
        results = [f.result(WAIT_S) for f in futures]
    assert innocent.status_code == 200 and innocent.json()["choices"][0]["finish_reason"] == "length"
    assert tokenized.status_code == 200 and tokenized.json()["count"] > 0
    assert not early and done_at < min(answered), "an innocent request waited on a hostile template"
    statuses = sorted(r.status_code for r in results)
    assert set(statuses) <= {400, 503}, [r.text for r in results]
    timed_out = [r for r in results if r.status_code == 400]
    assert len(timed_out) >= 2  # the ones that got a worker were killed at the deadline
    assert all(f"within {TIMEOUT_S:g}s" in r.json()["error"]["message"] for r in results)
    assert server.state.templates.killed >= 2
    again = chat(http, chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert again.status_code == 200, again.text  # a fresh worker replaced each killed one


def test_a_rendered_prompt_over_the_cap_is_refused_before_tokenizing(server, http, monkeypatch):
    renderer = server.state.preparer.renderer
    encoded: list[int] = []
    real_encode = renderer.encode

    def spy(text, *args, **kwargs):
        encoded.append(len(text))
        return real_encode(text, *args, **kwargs)

    monkeypatch.setattr(renderer, "encode", spy)
    big = "{% for i in range(100000) %}0123456789{% endfor %}"  # 1,000,000 characters, one chunk at a time
    r = chat(http, chat_template=big)
    assert r.status_code == 400 and f"{cap(server)} characters" in r.json()["error"]["message"], r.text
    assert not encoded  # the worker stopped at the cap; nothing was tokenized
    # a renderer without the in-template cap (an HF tokenizer, say) is measured after rendering, still before encode
    monkeypatch.setattr(renderer, "render_text", lambda *a, **k: "x" * (cap(server) + 1))
    r = http.post("/tokenize", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400, r.text
    assert f"the cap is {cap(server)} characters" in r.json()["error"]["message"]
    assert not encoded


def test_a_requests_own_template_renders_as_in_process(server, http):
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{{ eos_token }}"
    r = http.post("/tokenize", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                     "chat_template": template})
    assert r.status_code == 200, r.text
    tok = server.state.preparer.tokenizer
    assert r.json()["tokens"] == tok.encode(f"<user>hi{tok.special['eos_token']}", add_special_tokens=False)


def test_a_schema_over_the_size_cap_is_a_400_naming_it(http):
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(400)}}
    r = chat(http, response_format={"type": "json_schema", "json_schema": {"name": "big", "schema": schema}})
    assert r.status_code == 400, r.text
    assert "over this server's limit of 8192 bytes" in r.json()["error"]["message"]


def test_a_requests_own_template_sees_developer_as_system(server, http):
    # vLLM's rule holds in the worker too: a template that knows no developer role renders it as system
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    ids = [http.post("/tokenize", json={"model": MODEL, "messages": [{"role": role, "content": "be brief"}],
                                        "chat_template": template}).json()["tokens"]
           for role in ("developer", "system")]
    assert ids[0] == ids[1]
    knows = "{% for m in messages %}{% if m['role'] == 'developer' %}D{% endif %}{{ m['content'] }}{% endfor %}"
    r = http.post("/tokenize", json={"model": MODEL, "messages": [{"role": "developer", "content": "x"}],
                                     "chat_template": knows})
    assert r.json()["tokens"] == server.state.preparer.tokenizer.encode("Dx", add_special_tokens=False)
