"""POST /pause in modes abort / wait / keep, and /resume: what happens to in-flight and newly arriving requests."""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import openai
import pytest
from server_cases import API_KEY, CKPT
from test_errors import frozen_after_first_token

from mm_infer import SamplingParams

AUTH = {"Authorization": f"Bearer {API_KEY}"}
LONG = 48  # tokens: long enough to be caught in flight on a slow CPU
# tokens for requests a pause in mode "abort" must catch: they cannot finish before /pause lands, however loaded
RUNAWAY = 900
# tokens for requests a pause in mode "wait" or "keep" must catch in flight and then compare with the oracle
CAUGHT = 300
PROMPT = "Count slowly:"


@pytest.fixture
def pool():
    with ThreadPoolExecutor(4) as ex:
        yield ex


def _post(server, path: str, **body) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers=AUTH, timeout=120)


def _complete(client, max_tokens: int = LONG):
    return client.completions.create(model="m", prompt=PROMPT, max_tokens=max_tokens, temperature=0,
                                     extra_body={"min_tokens": max_tokens, "return_token_ids": True})


def _generated(server) -> int:
    return sum(len(s.token_ids) for g in server.state.backend.core.groups.values() for s in g.seqs)


def _caught(server, pool, client, max_tokens: int) -> Future:
    """A completion submitted and frozen in flight after its first token: it cannot end, however fast the CPU, before
    the pause or refit that follows lifts the freeze (each sets it itself: keep freezes, the others thaw)."""
    with frozen_after_first_token(server, thaw=False) as frozen:
        fut = pool.submit(_complete, client, max_tokens)
        assert frozen.wait(60) and not fut.done(), "the request never got going"
    return fut


def _resume(server) -> None:
    r = _post(server, "/resume")
    assert r.status_code == 200 and r.json()["is_paused"] is False


def test_abort_ends_in_flight_requests_as_errors_and_holds_new_ones(server, client, pool):
    running = _caught(server, pool, client, RUNAWAY)
    r = _post(server, "/pause", mode="abort")
    try:
        assert r.status_code == 200 and r.json() == {"is_paused": True, "mode": "abort", "num_paused_requests": 1}
        with pytest.raises(openai.APIStatusError) as info:
            running.result(timeout=60)
        assert info.value.status_code == 503
        assert server.state.gate.num_inflight == 0 and not server.state.backend.core.groups
        waiting = pool.submit(_complete, client, 3)
        time.sleep(0.3)
        assert not waiting.done(), "a request arriving while paused must wait for resume"
        assert httpx.get(f"{server.base_url}/is_paused", headers=AUTH).json()["mode"] == "abort"
    finally:
        _resume(server)
    assert waiting.result(timeout=60).choices[0].finish_reason == "length"


def test_abort_ends_a_stream_with_an_error_event(server, pool):
    body = {"model": "m", "prompt": PROMPT, "max_tokens": RUNAWAY, "min_tokens": RUNAWAY, "temperature": 0,
            "stream": True}
    events: list[str] = []
    with frozen_after_first_token(server) as frozen, \
            httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, headers=AUTH, timeout=60) as resp:
        lines = resp.iter_lines()
        events.append(next(line for line in lines if line.startswith("data:")))
        assert frozen.wait(60)  # it cannot end before the pause (which lifts the freeze) lands
        paused = pool.submit(_post, server, "/pause", mode="abort")
        events += [line for line in lines if line.startswith("data:")]
    try:
        assert paused.result(timeout=60).json()["num_paused_requests"] == 1
    finally:
        _resume(server)
    error = json.loads(events[-2].removeprefix("data: "))
    assert error["error"]["code"] == 503 and events[-1] == "data: [DONE]"
    assert all(json.loads(e.removeprefix("data: "))["choices"][0].get("finish_reason") != "length"
               for e in events[:-2])


def test_wait_lets_in_flight_requests_finish_first(server, client, llm, pool):
    running = _caught(server, pool, client, CAUGHT)
    r = _post(server, "/pause", mode="wait")
    try:
        assert r.status_code == 200 and r.json()["num_paused_requests"] == 1
        assert not server.state.backend.core.groups, "pause(wait) returns only once in-flight requests finished"
        out = running.result(timeout=60)
        assert out.choices[0].finish_reason == "length"
        ref = llm.generate({"prompt": PROMPT}, SamplingParams(temperature=0, max_tokens=CAUGHT, min_tokens=CAUGHT),
                           use_tqdm=False)[0]
        assert out.choices[0].model_extra["token_ids"] == ref.outputs[0].token_ids
        waiting = pool.submit(_complete, client, 3)
        time.sleep(0.3)
        assert not waiting.done()
    finally:
        _resume(server)
    assert waiting.result(timeout=60).choices[0].finish_reason == "length"


def test_keep_freezes_in_flight_requests_until_resume(server, client, llm, pool):
    running = _caught(server, pool, client, CAUGHT)
    r = _post(server, "/pause", mode="keep")
    try:
        assert r.status_code == 200 and r.json()["num_paused_requests"] == 1
        frozen = _generated(server)  # the pause returned after any step under way had landed
        time.sleep(0.4)
        assert _generated(server) == frozen < CAUGHT, "nothing may be generated while kept"
        assert not running.done()
        waiting = pool.submit(_complete, client, 3)
        time.sleep(0.2)
        assert not waiting.done()
    finally:
        _resume(server)
    out = running.result(timeout=60)
    ref = llm.generate({"prompt": PROMPT}, SamplingParams(temperature=0, max_tokens=CAUGHT, min_tokens=CAUGHT),
                       use_tqdm=False)[0]
    assert out.choices[0].model_extra["token_ids"] == ref.outputs[0].token_ids  # resumed exactly where it was
    assert waiting.result(timeout=60).choices[0].finish_reason == "length"


def test_refit_while_kept_applies_to_later_requests(server, client, pool):
    r = _post(server, "/pause", mode="keep")
    try:
        version = httpx.get(f"{server.base_url}/weight_version", headers=AUTH).json()["weight_version"]
        refit = _post(server, "/update_weights_from_disk", model_path=str(CKPT))
        assert refit.status_code == 200 and refit.json()["weight_version"] == version + 1
        assert httpx.get(f"{server.base_url}/is_paused", headers=AUTH).json()["is_paused"] is True
    finally:
        _resume(server)
    assert r.status_code == 200
    out = _complete(client, 2)
    assert out.model_extra["weight_version"] == version + 1


def test_pause_rejects_unknown_modes_and_defaults_to_abort(server):
    assert _post(server, "/pause", mode="later").status_code == 400
    try:
        bare = httpx.post(f"{server.base_url}/pause", headers=AUTH)  # no body at all
        assert bare.status_code == 200 and bare.json()["mode"] == "abort"
    finally:
        _resume(server)
    assert httpx.get(f"{server.base_url}/is_paused", headers=AUTH).json() == {"is_paused": False, "mode": None,
                                                                               "num_paused_requests": None}


@pytest.mark.parametrize("abort", [False, True])
def test_refit_while_running_waits_or_aborts_then_resumes(server, client, pool, abort):
    running = _caught(server, pool, client, CAUGHT)
    refit = _post(server, "/update_weights_from_disk", model_path=str(CKPT), abort_all_requests=abort)
    assert refit.status_code == 200 and refit.json()["num_paused_requests"] == 1
    assert httpx.get(f"{server.base_url}/is_paused", headers=AUTH).json()["is_paused"] is False
    if abort:
        with pytest.raises(openai.APIStatusError) as info:
            running.result(timeout=60)
        assert info.value.status_code == 503
    else:
        out = running.result(timeout=60)  # finished on the old weights before they changed
        assert out.choices[0].finish_reason == "length"
        assert out.model_extra["weight_version"] == refit.json()["weight_version"] - 1
    metrics = httpx.get(f"{server.base_url}/metrics", headers=AUTH).text
    assert f"mm_infer_weight_version {refit.json()['weight_version']}" in metrics and "mm_infer_paused 0" in metrics


def test_a_client_that_gives_up_while_paused_costs_nothing(server):
    r = _post(server, "/pause", mode="keep")
    try:
        assert r.status_code == 200
        body = {"model": "m", "prompt": PROMPT, "max_tokens": LONG, "min_tokens": LONG}  # would still run below
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.base_url}/v1/completions", json=body, headers=AUTH, timeout=0.5)
        time.sleep(0.5)  # the server notices the disconnect on its next poll
    finally:
        _resume(server)
    time.sleep(0.3)
    assert server.state.gate.num_inflight == 0 and not server.state.backend.core.groups
    assert server.state.metrics.running == 0


def test_the_gate_hands_freed_heap_back_when_the_last_request_leaves():
    """The server keeps freed heap for its next burst; once idle it trims (at most once a second), so its RSS after a
    burst falls back instead of reading as a leak (scripts/soak/run.py checks the server's RSS growth)."""
    import asyncio

    from mm_infer.engine_core.heap_trim import IdleTrimmer
    from servers.openai.control.pause import PauseGate

    async def scenario() -> list[float]:
        now, trims = [0.0], []
        gate = PauseGate(engine=None)  # type: ignore[arg-type]  # admit/leave never touch the engine
        gate._trimmer = IdleTrimmer(lambda: trims.append(now[0]), clock=lambda: now[0])
        a, b = await gate.admit("a"), await gate.admit("b")
        gate.leave(a)  # b still in flight: no trim
        now[0] = 5.0
        gate.leave(b)  # idle: trim
        gate.leave(await gate.admit("c"))  # idle again within the second: no second walk of the heap
        now[0] = 6.5
        gate.leave(await gate.admit("d"))
        return trims

    assert asyncio.run(scenario()) == [5.0, 6.5]
