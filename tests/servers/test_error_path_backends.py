"""One error path: the same engine failure gives the same status, body and one log line on every backend (the
engine on a thread here, in its own process, and behind Ray replicas)."""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from server_cases import CKPT

from mm_infer.engine.control.ops import Sleep, WakeUp
from mm_infer.engine.errors import NONFINITE_MODEL, NONFINITE_PARAMS
from servers.openai.bodies.errors import error_body
from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port

OPTIONS = {"num_kv_blocks": 64, "max_model_len": 256, "cpu_threads": 1}
BACKENDS = {"thread": {"engine_core": "thread"}, "process": {"engine_core": "process"}, "replicas": {"replicas": 2}}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module", params=list(BACKENDS))
def served(request: pytest.FixtureRequest) -> Iterator[BackgroundServer]:
    if request.param == "replicas":
        pytest.importorskip("ray")
    config = ServerConfig(model_dir=str(CKPT), port=free_port(), enable_sleep_mode=True, engine_options=OPTIONS,
                          allowed_weights_paths=(CKPT.parent, Path(tempfile.gettempdir())), **BACKENDS[request.param])
    srv = BackgroundServer(config).start(timeout_s=300)
    yield srv
    srv.stop()


def _post(srv: BackgroundServer, path: str, body: dict[str, Any] | None = None, **params: Any) -> httpx.Response:
    return httpx.post(f"{srv.base_url}{path}", json=body, params=params, timeout=120)


def _logged(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if message in r.getMessage()]


def _error_of(reply: httpx.Response) -> tuple[int, dict[str, Any]]:
    """(status, error body): the response's own, or a stream's error event (the failure came after its first
    chunk, when the status line had gone out)."""
    if reply.status_code != 200 or not reply.headers["content-type"].startswith("text/event-stream"):
        return reply.status_code, reply.json()
    events = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
    assert "error" in events[-1] and reply.text.rstrip().endswith("data: [DONE]"), reply.text
    return events[-1]["error"]["code"], events[-1]


def _assert_error(reply: httpx.Response, status: int, message: str, caplog: pytest.LogCaptureFixture,
                  param: str | None = None) -> None:
    """The exact OpenAI error body; answered before a stream began, one server log line (WARNING for a 4xx, ERROR
    for a 5xx) naming it."""
    assert _error_of(reply) == (status, error_body(status, message, param)), reply.text
    if reply.status_code == status:
        lines = _logged(caplog, message)
        assert len(lines) == 1, [r.getMessage() for r in lines]
        assert lines[0].levelno == (logging.WARNING if status < 500 else logging.ERROR)
    caplog.clear()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_bad_params_found_in_the_step_are_a_400_naming_them(served, caplog, path, stream):
    body = {**CHAT, "repetition_penalty": 1e-300, "stream": stream}
    if path == "/v1/completions":
        body = {"prompt": "hi", "max_tokens": 4, "repetition_penalty": 1e-300, "stream": stream}
    with caplog.at_level(logging.WARNING):
        reply = _post(served, path, body)
    _assert_error(reply, 400, NONFINITE_PARAMS.message, caplog)
    assert "repetition_penalty" in NONFINITE_PARAMS.message


def test_an_engine_error_after_the_first_chunk_is_logged_once(served, caplog):
    body = {"prompt": "hi", "max_tokens": 4, "repetition_penalty": 1e-300, "stream": True}
    with caplog.at_level(logging.WARNING):
        reply = _post(served, "/v1/completions", body)
    if reply.status_code != 200:
        pytest.skip("this backend failed the request before its first chunk")
    assert _error_of(reply) == (400, error_body(400, NONFINITE_PARAMS.message))
    assert len(_logged(caplog, NONFINITE_PARAMS.message)) == 1


def test_a_prompt_too_long_is_a_400(served, caplog):
    with caplog.at_level(logging.WARNING):
        reply = _post(served, "/v1/completions", {"prompt": "x " * 400, "max_tokens": 4})
    _assert_error(reply, 400, "prompt has 401 tokens; the context length is 256 (model limit, max_model_len and "
                  "KV cache size)", caplog, param="input_tokens")  # vLLM's param for it


def _nan_norm(folder: Path) -> Path:
    """A one-tensor checkpoint: the final norm all NaN (every logit non-finite)."""
    with safe_open(str(CKPT / "model.safetensors"), framework="pt") as f:
        norm = f.get_tensor("model.norm.weight")
    save_file({"model.norm.weight": torch.full_like(norm, float("nan"))}, str(folder / "model.safetensors"))
    return folder


def test_a_model_producing_non_finite_logits_is_a_500(served, caplog, tmp_path):
    broken = _nan_norm(tmp_path)
    assert _post(served, "/update_weights_from_disk", {"model_path": str(broken), "allow_nonfinite": True}).is_success
    try:
        with caplog.at_level(logging.WARNING):
            reply = _post(served, "/v1/chat/completions", CHAT)
        _assert_error(reply, 500, NONFINITE_MODEL.message, caplog)
    finally:
        assert _post(served, "/update_weights_from_disk", {"model_path": str(CKPT)}).is_success
    assert _post(served, "/v1/chat/completions", CHAT).status_code == 200


def test_an_engine_asleep_under_the_server_is_a_503(served, caplog):
    """Slept behind the server's back (its gate does not know): the engine's own refusal is a 503 naming why."""
    backend = served.state.backend
    asyncio.run(backend.control(Sleep(1)))
    try:
        with caplog.at_level(logging.WARNING):
            reply = _post(served, "/v1/chat/completions", CHAT)
        _assert_error(reply, 503, "the engine is asleep (level 1: the KV cache and the weights released); "
                      "POST /wake_up first", caplog)
    finally:
        asyncio.run(backend.control(WakeUp()))
    assert _post(served, "/v1/chat/completions", CHAT).status_code == 200


def test_sleep_level_2_wake_and_a_refit_from_disk_serve_again(served, caplog):
    """The documented refit after a level-2 sleep: requests are refused (503) until every weight is back, then
    served, with no second /wake_up."""
    assert _post(served, "/sleep", level=2).is_success
    assert _post(served, "/wake_up").is_success
    with caplog.at_level(logging.WARNING):
        refused = _post(served, "/v1/chat/completions", CHAT)
    assert refused.status_code == 503 and "not reloaded" in refused.json()["error"]["message"]
    assert len(_logged(caplog, "not reloaded")) == 1
    refit = _post(served, "/update_weights_from_disk", {"model_path": str(CKPT)})
    assert refit.is_success and refit.json()["num_tensors"] == 58
    assert not served.state.backend.sleep_state.is_sleeping and served.state.backend.sleep_state.weights == "loaded"
    reply = _post(served, "/v1/chat/completions", CHAT)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["finish_reason"] in ("length", "stop")
