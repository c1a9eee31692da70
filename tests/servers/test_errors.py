"""Every error path answers an OpenAI error body with the right status; a vanished client frees its blocks."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from server_cases import API_KEY, MAX_MODEL_LEN, MEDIA, NUM_BLOCKS

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def post(server, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers=AUTH if headers is None else headers,
                      timeout=60)


def chat(content, **kw) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 2, "temperature": 0, **kw}


def image(url: str) -> list[dict]:
    return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "x"}]


def b64(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def assert_error(r: httpx.Response, status: int, words: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == status
    assert words.lower() in err["message"].lower(), err["message"]
    return err


def test_missing_or_wrong_api_key_is_401(server):
    assert_error(post(server, "/v1/chat/completions", chat("hi"), headers={}), 401, "api key")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="wrong", max_retries=0).models.list()
    assert httpx.get(f"{server.base_url}/health").status_code == 200  # health stays open


def test_unknown_fields_are_named(server):
    err = assert_error(post(server, "/v1/chat/completions", chat("hi", bar=2, foo=1)), 400,
                       "unrecognized request argument")
    assert "bar" in err["message"] and "foo" in err["message"]
    bad_part = chat([{"type": "text", "text": "x", "colour": "red"}])
    assert "colour" in assert_error(post(server, "/v1/chat/completions", bad_part), 400, "unrecognized")["message"]


def test_unhonoured_params_are_400(server):
    assert_error(post(server, "/v1/chat/completions", chat("hi", logprobs_mode="raw_logits")), 400, "logprobs_mode")
    assert_error(post(server, "/v1/chat/completions", chat("hi", tool_choice={"type": "function", "function": {
        "name": "g"}}, tools=[{"type": "function", "function": {"name": "f"}}])), 400, "tool_choice")
    assert_error(post(server, "/v1/chat/completions", chat("hi", top_logprobs=2)), 400, "logprobs")
    assert_error(post(server, "/v1/chat/completions", chat("hi", prompt_logprobs=21)), 400, "prompt_logprobs")


def test_bad_image_is_400_and_unsupported_is_415(server):
    assert_error(post(server, "/v1/chat/completions", chat(image(b64(b"not an image at all")))), 400, "decodable")
    assert_error(post(server, "/v1/chat/completions", chat(image(b64(b"%PDF-1.4 x", "application/pdf")))), 415,
                 "PDF")
    assert_error(post(server, "/v1/chat/completions", chat(image("data:image/png,abc"))), 415, "base64")
    assert_error(post(server, "/v1/chat/completions", chat(image("ftp://example.com/a.png"))), 400, "scheme")


def test_too_large_is_413(server):
    big_media = b64(os.urandom(1_200_000))  # over the 1 MiB media cap, under the 4 MiB body cap
    assert_error(post(server, "/v1/chat/completions", chat(image(big_media))), 413, "limit")
    huge_body = chat("x" * (5 << 20))
    assert_error(post(server, "/v1/chat/completions", huge_body), 413, "body")


def test_file_url_outside_allowed_paths_is_403(server, tmp_path):
    outside = tmp_path / "p.png"
    outside.write_bytes((MEDIA / "images" / "tiny_9x13.png").read_bytes())
    assert_error(post(server, "/v1/chat/completions", chat(image(f"file://{outside}"))), 403, "allowed-media-path")
    sneaky = f"file://{MEDIA}/../models/tiny-qwen2-vl/config.json"
    assert_error(post(server, "/v1/chat/completions", chat(image(sneaky))), 403, "allowed-media-path")
    missing = f"file://{MEDIA}/images/none.png"
    assert_error(post(server, "/v1/chat/completions", chat(image(missing))), 400, "cannot read")


def test_private_http_url_is_refused(server):
    url = f"{server.base_url}/version"  # loopback: refused before any connection is made
    assert_error(post(server, "/v1/chat/completions", chat(image(url))), 403, "private")


def test_context_overflow_gives_both_lengths(server):
    err = assert_error(post(server, "/v1/chat/completions", chat("hello " * (MAX_MODEL_LEN + 50))), 400,
                       "context length")
    assert str(MAX_MODEL_LEN) in err["message"]
    n = post(server, "/tokenize", {"prompt": "hello " * (MAX_MODEL_LEN + 50)}).json()["count"]
    assert n > MAX_MODEL_LEN


def test_mm_processor_kwargs_above_cap_is_400(server, photo_url):
    body = chat(image(photo_url), mm_processor_kwargs={"max_pixels": 10**9})
    assert_error(post(server, "/v1/chat/completions", body), 400, "cap")
    body = chat(image(photo_url), mm_processor_kwargs={"fps": 100.0})
    assert_error(post(server, "/v1/chat/completions", body), 400, "cap")
    body = chat(image(photo_url), mm_processor_kwargs={"num_frames": 2.5})
    assert_error(post(server, "/v1/chat/completions", body), 400, "positive integer")
    body = chat(image(photo_url), mm_processor_kwargs={"bogus": 1})
    assert_error(post(server, "/v1/chat/completions", body), 400, "unrecognized mm_processor_kwargs")


def test_impossible_splice_is_400(server):
    messages = [{"role": "user", "content": "a"},
                {"role": "assistant", "content": "b", "prompt_token_ids": [1, 2, 3], "generation_token_ids": [4]},
                {"role": "user", "content": "c"}]
    assert_error(post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1}), 400, "splice")
    messages[1]["generation_token_ids"] = [10**6]
    assert_error(post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1}), 400, "vocabulary")


def _wait_idle(server, timeout_s: float = 20.0) -> None:
    engine = server.state.backend.core
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not engine.groups and engine.block_manager.num_free_blocks == NUM_BLOCKS:
            return
        time.sleep(0.05)
    raise AssertionError(f"blocks not freed: {engine.block_manager.num_free_blocks}/{NUM_BLOCKS} free, "
                         f"groups {list(engine.groups)}")


@contextlib.contextmanager
def frozen_after_first_token(server, rid: str | None = None, thaw: bool = True) -> Iterator[threading.Event]:
    """Freeze the engine loop (as /pause "keep" does) in the step that gives `rid` (None: any request) its first
    token, so the request cannot end, however fast the CPU, until the freeze is lifted: by a pause or refit (they set
    the freeze themselves), or on the way out (unless not `thaw`; a failure always thaws). The event is set once
    frozen."""
    core, loop = server.state.backend.core, server.state.backend.async_engine
    step, caught = core.step, threading.Event()

    def step_then_freeze():
        outs = step()
        groups = list(core.groups.values()) if rid is None else [g for g in [core.groups.get(rid)] if g is not None]
        if not caught.is_set() and any(s.token_ids for g in groups for s in g.seqs):
            loop.frozen = True  # we run under the step lock: the loop checks it before the next step
            caught.set()
        return outs

    core.step = step_then_freeze
    try:
        yield caught
    except BaseException:
        thaw = True
        raise
    finally:
        del core.step  # the class's own method again
        if thaw:
            loop.set_frozen(False)


@pytest.mark.parametrize("stream", [False, True])
def test_client_disconnect_aborts_and_frees_blocks(server, stream):
    # No clock decides the outcome: the request is frozen mid-generation before the client leaves, so it can only
    # end by the abort the disconnect causes (the deadlines below only turn a hang into a failure).
    _wait_idle(server)
    before = server.state.metrics.aborted
    rid = f"chatcmpl-gone-{stream}"
    body = chat("go on forever", max_tokens=MAX_MODEL_LEN, ignore_eos=True, stream=stream,
                request_id=rid.removeprefix("chatcmpl-"))
    engine = server.state.backend.core
    with frozen_after_first_token(server, rid) as frozen:
        if stream:
            with httpx.Client(base_url=server.base_url, headers=AUTH, timeout=60) as c, \
                    c.stream("POST", "/v1/chat/completions", json=body) as r:
                lines = r.iter_lines()  # kept: a dropped line iterator closes the response (the client leaves)
                assert next(line for line in lines if line.startswith("data:"))
                assert frozen.wait(60) and rid in engine.groups, "the request should be running"
        else:  # a bare socket: the client leaves while the server still owes it the whole answer
            payload = json.dumps(body).encode()
            with socket.create_connection((server.state.config.host, server.state.config.port), timeout=60) as s:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          + f"Authorization: {AUTH['Authorization']}\r\nContent-Length: {len(payload)}\r\n\r\n"
                          .encode() + payload)
                assert frozen.wait(60) and rid in engine.groups, "the request should be running"
        _wait_idle(server, timeout_s=60)  # still frozen: only the disconnect's abort can have freed it
    assert server.state.metrics.aborted == before + 1
    text = httpx.get(f"{server.base_url}/metrics", headers=AUTH).text
    assert f"mm_infer_kv_blocks_free {NUM_BLOCKS}" in text


def test_engine_side_abort_is_never_a_completion(server):
    import threading

    _wait_idle(server)
    result: dict = {}
    body = chat("abort me", max_tokens=MAX_MODEL_LEN, ignore_eos=True, request_id="to-abort")
    worker = threading.Thread(target=lambda: result.update(r=post(server, "/v1/chat/completions", body)))
    worker.start()
    engine = server.state.backend
    deadline = time.monotonic() + 20
    while "chatcmpl-to-abort" not in engine.core.groups:
        assert time.monotonic() < deadline and worker.is_alive(), "request never started"
        time.sleep(0.01)
    engine.abort("chatcmpl-to-abort")  # notify=True: the stream gets a final output with finish_reason "abort"
    worker.join(timeout=30)
    assert_error(result["r"], 503, "aborted")
    _wait_idle(server)


def test_bad_prompt_in_a_batch_fails_it_and_frees_the_rest(server):
    _wait_idle(server)
    body = {"prompt": [[5, 6, 7], [3006] * 3], "max_tokens": 200, "ignore_eos": True}  # stray image pads
    assert_error(post(server, "/v1/completions", body), 400, "placeholder")
    _wait_idle(server)


def test_malformed_json_and_unknown_route(server):
    r = httpx.post(f"{server.base_url}/v1/chat/completions", content=b"{not json",
                   headers={**AUTH, "Content-Type": "application/json"})
    assert_error(r, 400, "json")
    r = httpx.post(f"{server.base_url}/v1/chat/completions", content=b"plain words", headers=AUTH)
    assert_error(r, 400, "request body")
    assert_error(httpx.get(f"{server.base_url}/v1/nothing", headers=AUTH), 404, "not found")


def test_unknown_uuid_without_url_is_400(server):
    body = chat([{"type": "image_url", "uuid": "never-sent"}, {"type": "text", "text": "x"}])
    assert_error(post(server, "/v1/chat/completions", body), 400, "no cached image")
    assert_error(post(server, "/v1/chat/completions", chat([{"type": "image_url"}])), 400, "needs a URL")


def test_bad_prompt_in_a_streamed_batch_frees_the_rest(server):
    _wait_idle(server)
    running = server.state.metrics.running
    body = {"prompt": [[5, 6, 7], [3006] * 3], "max_tokens": 200, "ignore_eos": True, "stream": True}
    assert_error(post(server, "/v1/completions", body), 400, "placeholder")
    _wait_idle(server)
    assert server.state.metrics.running == running


@pytest.mark.parametrize("part", [{"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                                  {"type": "audio_url", "audio_url": {"url": "http://x/a.wav"}}],
                         ids=["input_audio", "audio_url"])
def test_an_audio_part_is_400_on_a_model_without_an_audio_tower(server, part):
    # catches: an audio part dropped silently on a Qwen model (the answer would ignore the audio), fetched before
    # being refused, or a bare schema error; Nemotron Omni with an audio tower serves it (test_omni_audio_server.py)
    err = assert_error(post(server, "/v1/chat/completions", chat([part, {"type": "text", "text": "x"}])), 400,
                       "audio input is not served")
    assert "has no audio tower" in err["message"] and server.state.config.model_name in err["message"]
    assert err["param"] == "messages[0].content[0]"
