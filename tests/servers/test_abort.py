"""POST /abort_requests: by id (as answered, or as sent), mid-stream and whole, with the partial output in the error;
unknown ids, bad bodies, X-Request-Id, and requests that were not named go on untouched."""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest
from server_cases import API_KEY

from mm_infer import SamplingParams

AUTH = {"Authorization": f"Bearer {API_KEY}"}
RUNAWAY = 900  # tokens: cannot finish before the abort lands, however loaded the machine
PROMPT = "Count slowly:"


@pytest.fixture
def pool():
    with ThreadPoolExecutor(4) as ex:
        yield ex


def _post(server, path: str, body: dict, headers: dict | None = None, timeout: float = 120) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers={**AUTH, **(headers or {})}, timeout=timeout)


def _abort(server, *ids: str) -> dict:
    r = _post(server, "/abort_requests", {"request_ids": list(ids)})
    assert r.status_code == 200, r.text
    return r.json()


def _chat(request_id: str | None, max_tokens: int = RUNAWAY, **extra) -> dict:
    body = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
            "min_tokens": max_tokens, "temperature": 0, "return_token_ids": True, "logprobs": True, **extra}
    return body if request_id is None else {**body, "request_id": request_id}


def _until_running(server, rid: str, fut: Future | None = None) -> None:
    deadline = time.monotonic() + 60
    while not any(rid == g and sum(len(s.token_ids) for s in grp.seqs) >= 2
                  for g, grp in list(server.state.backend.core.groups.items())):
        assert (fut is None or not fut.done()) and time.monotonic() < deadline, "the request never got going"
        time.sleep(0.005)


def _oracle(llm, n: int) -> list[int]:
    ref = llm.generate({"messages": [{"role": "user", "content": PROMPT}]},
                       SamplingParams(temperature=0, max_tokens=n, min_tokens=n), use_tqdm=False)[0]
    return list(ref.outputs[0].token_ids)


def _tokens(events: list[str]) -> tuple[list[int], list[float]]:
    """Token ids and logprobs the chunks among `events` carry."""
    ids: list[int] = []
    lps: list[float] = []
    for e in events:
        for c in json.loads(e[6:]).get("choices") or []:
            assert c.get("finish_reason") is None, "an aborted stream never finishes normally"
            ids += c.get("token_ids") or []
            lps += [t["logprob"] for t in (c.get("logprobs") or {}).get("content") or []]
    return ids, lps


def test_abort_mid_stream_ends_with_an_error_event_carrying_the_partial_tokens(server, llm, pool):
    events: list[str] = []
    with httpx.stream("POST", f"{server.base_url}/v1/chat/completions", json=_chat("ab-stream", stream=True),
                      headers=AUTH, timeout=120) as resp:
        assert resp.headers["x-request-id"] == "chatcmpl-ab-stream"
        lines = resp.iter_lines()
        for line in lines:
            events += [line] if line.startswith("data: {") else []
            if len(_tokens(events)[0]) >= 3:
                break
        answer = pool.submit(_abort, server, "chatcmpl-ab-stream")
        events += [line for line in lines if line.startswith("data:")]
    assert answer.result(timeout=60) == {"aborted": ["chatcmpl-ab-stream"], "not_found": []}
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][6:])
    assert error["error"]["code"] == 503 and "abort_requests" in error["error"]["message"]
    streamed, lps = _tokens(events[:-2])
    (part,) = error["partial"]["choices"]
    assert part["finish_reason"] == "abort" and part["token_ids"][:len(streamed)] == streamed
    assert len(part["logprobs"]) == len(part["token_ids"]) >= len(streamed) >= 3
    assert part["logprobs"][:len(lps)] == lps
    assert part["token_ids"] == _oracle(llm, len(part["token_ids"]))  # real tokens: the greedy ones
    assert server.state.gate.num_inflight == 0


def test_abort_whole_request_by_its_own_id_is_a_503_with_the_partial_output(server, llm, pool):
    running = pool.submit(_post, server, "/v1/chat/completions", _chat("ab-whole"))
    _until_running(server, "chatcmpl-ab-whole", running)
    assert _abort(server, "ab-whole") == {"aborted": ["chatcmpl-ab-whole"], "not_found": []}  # as the client sent it
    r = running.result(timeout=60)
    assert r.status_code == 503 and r.headers["x-request-id"] == "chatcmpl-ab-whole"
    body = r.json()
    assert body["error"]["type"] == "aborted"
    (part,) = body["partial"]["choices"]
    assert part["token_ids"] and len(part["logprobs"]) == len(part["token_ids"])
    assert part["token_ids"] == _oracle(llm, len(part["token_ids"]))
    assert body["partial"]["prompt_token_ids"] and body["partial"]["request_id"] == "chatcmpl-ab-whole"


def test_abort_a_generate_request_and_a_completion_batch(server, pool):
    gen = {"request_id": "ab-gen", "token_ids": [1, 2, 3], "sampling_params": {
        "max_tokens": RUNAWAY, "min_tokens": RUNAWAY, "temperature": 0, "logprobs": 0}}
    running = pool.submit(_post, server, "/inference/v1/generate", gen)
    _until_running(server, "generate-tokens-ab-gen", running)
    batch = {"model": "m", "prompt": [PROMPT, "Another:"], "max_tokens": RUNAWAY, "min_tokens": RUNAWAY,
             "request_id": "ab-batch"}
    both = pool.submit(_post, server, "/v1/completions", batch)
    _until_running(server, "cmpl-ab-batch-1", both)
    answer = _abort(server, "generate-tokens-ab-gen", "cmpl-ab-batch")
    assert sorted(answer["aborted"]) == ["cmpl-ab-batch-0", "cmpl-ab-batch-1", "generate-tokens-ab-gen"]
    r = running.result(timeout=60)
    assert r.status_code == 503 and r.json()["partial"]["choices"][0]["token_ids"]
    assert both.result(timeout=60).status_code == 503


def test_other_requests_go_on_untouched(server, llm, pool):
    victim = pool.submit(_post, server, "/v1/chat/completions", _chat("ab-victim"))
    bystander = pool.submit(_post, server, "/v1/chat/completions", _chat("ab-bystander", max_tokens=40))
    _until_running(server, "chatcmpl-ab-victim", victim)
    assert _abort(server, "ab-victim")["aborted"] == ["chatcmpl-ab-victim"]
    assert victim.result(timeout=60).status_code == 503
    r = bystander.result(timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    assert r.json()["choices"][0]["token_ids"] == _oracle(llm, 40)


def test_abort_before_admission_answers_503(server, pool):
    """A request named before it reached the engine (here: held by a pause) is refused once it gets there."""
    assert _post(server, "/pause", {"mode": "wait"}).status_code == 200
    try:
        held = pool.submit(_post, server, "/v1/chat/completions", _chat("ab-held", max_tokens=4))
        deadline = time.monotonic() + 30
        while "chatcmpl-ab-held" not in server.state.gate._pending:
            assert time.monotonic() < deadline and not held.done()
            time.sleep(0.01)
        assert _abort(server, "ab-held") == {"aborted": ["chatcmpl-ab-held"], "not_found": []}
    finally:
        assert _post(server, "/resume", {}).status_code == 200
    r = held.result(timeout=60)
    assert r.status_code == 503 and "abort_requests" in r.json()["error"]["message"]
    assert r.headers["x-request-id"] == "chatcmpl-ab-held"


def test_unknown_ids_and_bad_bodies(server):
    assert _abort(server, "never-sent", "chatcmpl-never") == {"aborted": [], "not_found": ["never-sent",
                                                                                          "chatcmpl-never"]}
    r = _post(server, "/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": 2, "request_id": "done"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "cmpl-done"
    assert _abort(server, "cmpl-done")["not_found"] == ["cmpl-done"]  # finished already: nothing to end
    for body, param in [({}, "request_ids"), ({"request_ids": []}, "request_ids"),
                        ({"request_ids": "x"}, "request_ids"), ({"request_ids": ["x"], "ids": 1}, "ids")]:
        r = _post(server, "/abort_requests", body)
        # a missing or mistyped field is answered as vLLM's validation answers it: param "body.<field>"
        assert r.status_code == 400 and r.json()["error"]["param"].removeprefix("body.").startswith(param), (body,
                                                                                                        r.text)
    assert httpx.post(f"{server.base_url}/abort_requests", json={"request_ids": ["x"]}).status_code == 401
    r = _post(server, "/inference/v1/abort_requests", {"request_ids": ["x"]})
    assert r.status_code == 200 and r.json()["not_found"] == ["x"]


def test_x_request_id_names_the_request(server):
    r = _post(server, "/v1/chat/completions", _chat(None, max_tokens=2), headers={"X-Request-Id": "hdr-7"})
    assert r.status_code == 200 and r.json()["id"] == "chatcmpl-hdr-7" and r.headers["x-request-id"] == "chatcmpl-hdr-7"
    r = _post(server, "/v1/chat/completions", _chat(None, max_tokens=2))
    assert r.headers["x-request-id"] == r.json()["id"]
    r = _post(server, "/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 2, "request_id": "rq"})
    assert r.status_code == 200 and r.json()["id"] == r.headers["x-request-id"] == "resp_rq"
