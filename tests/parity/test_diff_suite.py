"""The vLLM differential suite (scripts/peers/diff_vllm.py): its comparison finds each kind of difference, ignores how a
stream was split, its allowlist explains only what it names, and, where the vLLM CPU peer is set up, a seeded sample
of cases on the tiny checkpoint has no unexplained difference."""

from __future__ import annotations

import pytest
from parity_cases import CKPT
from peer_cases import needs_peer
from script_modules import load_script

diff_vllm = load_script("peers.diff_vllm")
cmp = load_script("peers.diff_compare")
cases = load_script("peers.diff_cases")
allow = load_script("peers.diff_allowlist")

CHAT = {"object": "chat.completion", "model": "tiny", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "It is calm.", "reasoning": None},
     "finish_reason": "stop", "stop_reason": None, "token_ids": [5, 6, 7],
     "logprobs": {"content": [{"token": "It", "logprob": -0.5, "bytes": [73, 116], "top_logprobs": []}]}}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}


def _reply(body=None, status=200, events=None):
    return cmp.Reply(status, body, events)


def _chunk(content: str | None, finish: str | None = None) -> dict:
    delta = {} if content is None else {"content": content}
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                           "finish_reason": finish}]}


def _kinds(diffs) -> list[tuple[str, str]]:
    return [(d.kind, d.path) for d in diffs]


def test_identical_replies_have_no_difference():
    assert cmp.compare(_reply(CHAT), _reply(CHAT), greedy=True) == []


def test_status_skeleton_and_value_differences_are_found_with_their_paths():
    assert _kinds(cmp.compare(_reply(CHAT, 200), _reply(CHAT, 400), greedy=True)) == [("status", "status")]
    missing = {**CHAT, "choices": [{k: v for k, v in CHAT["choices"][0].items() if k != "stop_reason"}]}
    found = cmp.compare(_reply(missing), _reply(CHAT), greedy=True)
    assert _kinds(found) == [("skeleton", "body.choices[].stop_reason")]
    other_ids = {**CHAT, "choices": [{**CHAT["choices"][0], "token_ids": [5, 6, 8]}]}
    found = cmp.compare(_reply(other_ids), _reply(CHAT), greedy=True)
    assert _kinds(found) == [("value", "body.choices[].token_ids[]")]
    assert cmp.compare(_reply(other_ids), _reply(CHAT), greedy=False) == []  # sampled: shapes only


def test_logprobs_are_equal_within_the_stated_bound_only():
    def with_logprob(x: float) -> dict:
        choice = {**CHAT["choices"][0], "logprobs": {"content": [{**CHAT["choices"][0]["logprobs"]["content"][0],
                                                                  "logprob": x}]}}
        return {**CHAT, "choices": [choice]}

    assert cmp.compare(_reply(with_logprob(-0.5 + cmp.LOGPROB_TOL / 2)), _reply(CHAT), greedy=True) == []
    far = cmp.compare(_reply(with_logprob(-0.5 + 3 * cmp.LOGPROB_TOL)), _reply(CHAT), greedy=True)
    assert _kinds(far) == [("value", "body.choices[].logprobs.content[].logprob")]


def test_streams_compare_by_meaning_not_by_how_tokens_were_split():
    theirs = (_chunk("It is"), _chunk(" calm."), _chunk(None, "stop"), "[DONE]")
    ours = (_chunk("It"), _chunk(" is"), _chunk(" calm."), _chunk(None, "stop"), "[DONE]")
    assert cmp.compare(_reply(events=ours), _reply(events=theirs), greedy=True) == []
    lost = (_chunk("It"), _chunk(None, "stop"), "[DONE]")  # the answer cut short: a value difference
    assert ("value", "stream.choices.0.content") in _kinds(cmp.compare(_reply(events=lost), _reply(events=theirs),
                                                                      greedy=True))
    no_done = ours[:-1]  # the stream's shape differs: an sse difference at the first unequal event (content chunks
    assert _kinds(cmp.compare(_reply(events=no_done), _reply(events=theirs), greedy=True)) == [("sse", "events[1]")]
    # joined: the choice's joined chunk is event 0, [DONE] event 1)


def test_a_stream_whose_chunks_were_joined_matches_but_a_missing_ending_does_not():
    # a fast engine joins deltas its reader has not taken yet (vLLM does too when it is the faster one): the last
    # chunk of a joined run decides its finish_reason; catches a comparison that counts chunks, and one that
    # forgives a stream whose last chunk lacks its finish_reason and fingerprint
    theirs = (_chunk("It"), _chunk(" is"), _chunk(" calm."), {**_chunk(None, "stop"), "system_fingerprint": "x"},
              "[DONE]")
    joined = (_chunk("It"), {**_chunk(" is calm.", "stop"), "system_fingerprint": "x"}, "[DONE]")
    assert cmp.compare(_reply(events=joined), _reply(events=theirs), greedy=True) == []
    unfinished = (_chunk("It"), _chunk(" is calm."), "[DONE]")  # no chunk ever says why it ended
    assert ("sse", "events[0]") in _kinds(cmp.compare(_reply(events=unfinished), _reply(events=theirs),
                                                       greedy=True))


def test_the_allowlist_explains_only_the_cases_and_kinds_it_names():
    refused = cmp.Diff("status", "status", "400", "200")
    assert allow.explained_by("error.beam_search", refused) is not None
    assert allow.explained_by("chat.3.plain", refused) is None
    assert allow.explained_by("error.beam_search", cmp.Diff("value", "body.x", "1", "2")) is None
    assert all(entry.reason for entry in allow.ALLOWLIST)


def test_a_conditional_entry_needs_its_condition_on_vllms_reply():
    # catches: the cut-tool-call entry hiding a stream that lost a finished call (it only explains length cuts)
    lost = cmp.Diff("skeleton", "stream.choices.0.tool_calls", "missing", "array")
    cut = _reply(events=(_chunk("<tool_call>"), _chunk(None, "length"), "[DONE]"))
    done = _reply(events=(_chunk("<tool_call>"), _chunk(None, "tool_calls"), "[DONE]"))
    assert allow.explained_by("tools.3.required", lost, cut) is not None
    assert allow.explained_by("tools.3.required", lost, done) is None
    assert allow.explained_by("tools.3.required", lost) is None
    assert allow.explained_by("chat.3.plain", lost, cut) is None
    status = cmp.Diff("status", "status", "200", "500")
    assert allow.explained_by("chat.2.video.defaults", status, _reply(status=500)) is not None
    assert allow.explained_by("chat.2.video.defaults", cmp.Diff("status", "status", "500", "200"),
                              _reply(status=200)) is None


def test_the_generator_is_seeded_and_each_setup_gets_its_own_kinds():
    plain = cases.generate(200, seed=3, setups=("plain",))
    assert plain == cases.generate(200, seed=3, setups=("plain",))
    assert plain != cases.generate(200, seed=4, setups=("plain",))
    assert len({c.name for c in plain}) == len(plain)  # names identify cases in reports and the allowlist
    assert not any(c.name.startswith(("tool", "reasoning")) for c in plain)
    tools = cases.generate(200, seed=3, setups=("tools",))
    assert any(c.name.startswith("tool") for c in tools)
    fixed = len(cases.sweep_cases()) + len(cases.tokenizer_cases()) + len(cases.error_cases())
    assert len(plain) == 200 + fixed and fixed > 50


def test_the_summary_line_counts_identical_cases_and_unexplained_differences():
    outcomes = [diff_vllm.Outcome("a", [], []),
                diff_vllm.Outcome("error.beam_search", [cmp.Diff("status", "status", "400", "200")], ["why"]),
                diff_vllm.Outcome("b", [cmp.Diff("value", "body.x", "1", "2")], [""])]
    assert diff_vllm.summary(outcomes) == "identical 1/3, unexplained differences 1"


@needs_peer
@pytest.mark.parametrize("setup", ["plain", "reasoning", "tools"])
def test_a_seeded_sample_against_the_vllm_peer_has_no_unexplained_difference(setup):
    """The suite's own run, smaller: 40 random cases plus every sweep, tokenizer and error case."""
    with diff_vllm.both_servers(CKPT, setup) as (ours, theirs):
        outcomes = diff_vllm.run_cases(ours, theirs, cases.generate(40, seed=11, setups=(setup,)))
    unexplained = [f"{o.case}: {d}" for o in outcomes for d in o.unexplained]
    assert not unexplained, "\n".join(unexplained[:20])


STREAMS = [  # greedy, so n = 1: vLLM 0.32 refuses n > 1 at temperature 0
    ("chat", {"messages": cases.USER, "max_tokens": 12, "logprobs": True, "top_logprobs": 1}),
    ("chat", {"messages": cases.USER, "max_tokens": 10, "stream_options": {"include_usage": True}}),
    ("chat", {"messages": cases.USER, "max_tokens": 16, "stop": ["."]}),
    ("completions", {"prompt": "Once upon a time", "max_tokens": 10, "logprobs": 1}),
    ("completions", {"prompt": "Count: 1 2 3", "max_tokens": 8, "stream_options": {"include_usage": True}}),
]


def _read_with_openai(base: str, kind: str, body: dict) -> dict:
    """What the official client makes of a stream: per choice its text, finish reason and logprob count."""
    import openai

    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    create = client.chat.completions.create if kind == "chat" else client.completions.create
    out: dict = {}
    for chunk in create(model=cases.MODEL, stream=True, temperature=0, **body):
        for choice in chunk.choices:
            acc = out.setdefault(choice.index, {"text": "", "finish": None, "logprobs": 0})
            acc["text"] += (choice.delta.content if kind == "chat" else choice.text) or ""
            acc["finish"] = choice.finish_reason or acc["finish"]
            if choice.logprobs is not None:
                acc["logprobs"] += len(choice.logprobs.content or []) if kind == "chat" else len(
                    choice.logprobs.tokens or [])
    return out


def _read_raw(base: str, kind: str, body: dict) -> dict:
    """What a raw-JSON client makes of it: it indexes choices[0] and the required keys, as vLLM's chunks allow."""
    import json

    import httpx

    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    out: dict = {}
    with httpx.stream("POST", f"{base}{path}", json={"model": cases.MODEL, "stream": True, "temperature": 0, **body},
                      timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if not chunk["choices"]:  # the usage chunk
                continue
            choice = chunk["choices"][0]
            acc = out.setdefault(choice["index"], {"text": "", "finish": None, "logprobs": 0})
            acc["text"] += (choice["delta"].get("content") if kind == "chat" else choice["text"]) or ""
            acc["finish"] = choice["finish_reason"] or acc["finish"]
            if (logprobs := choice["logprobs"]) is not None:
                acc["logprobs"] += len(logprobs["content"] if kind == "chat" else logprobs["tokens"])
    return out


@needs_peer
def test_the_openai_client_and_a_raw_json_client_read_every_stream_the_same_from_both():
    with diff_vllm.both_servers(CKPT, "plain") as (ours, theirs):
        for kind, body in STREAMS:
            theirs_read = _read_with_openai(theirs, kind, body)
            assert _read_with_openai(ours, kind, body) == theirs_read, (kind, body)
            assert _read_raw(ours, kind, body) == _read_raw(theirs, kind, body) == theirs_read, (kind, body)
