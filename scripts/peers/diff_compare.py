"""The differential suite's comparison: two servers' replies to one case, as a list of differences with JSON paths."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

# keys whose values (not only their types) must be equal on a greedy case
VALUE_KEYS = frozenset({
    "token_ids", "prompt_token_ids", "content", "text", "reasoning", "reasoning_content", "finish_reason",
    "stop_reason", "arguments", "name", "role", "count", "tokens", "token_strs", "prompt", "prompt_tokens",
    "completion_tokens", "total_tokens", "reasoning_tokens", "object", "token", "bytes", "index", "type", "code",
    "param", "model", "max_model_len", "refusal", "tool_calls", "text_offset"})
SHAPE_VALUE_KEYS = frozenset({"object", "role", "type", "code", "param", "model", "index"})  # equal on every case
LOGPROB_KEYS = frozenset({"logprob"})
LOGPROB_TOL = 1e-4  # both run float32 on the same torch: the peer's logprobs were within 3e-6 of ours


@dataclass(frozen=True)
class Reply:
    """What a server answered: status, and the JSON body or the stream's decoded data events ("[DONE]" kept)."""
    status: int
    body: Any = None
    events: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class Diff:
    """One difference. kind: status | skeleton | value | sse; path: where, as a.b[].c."""
    kind: str
    path: str
    ours: str
    theirs: str

    def __str__(self) -> str:
        return f"{self.kind} {self.path}: ours {self.ours} | vllm {self.theirs}"


def json_type(x: Any) -> str:
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "boolean"
    if isinstance(x, int | float):
        return "number"
    if isinstance(x, str):
        return "string"
    return "array" if isinstance(x, list) else "object"


def _short(x: Any) -> str:
    text = json.dumps(x, ensure_ascii=False) if not isinstance(x, str) else repr(x)
    return text if len(text) <= 120 else text[:117] + "..."


def _equal(key: str, a: Any, b: Any) -> bool:
    if key in LOGPROB_KEYS and isinstance(a, int | float) and isinstance(b, int | float):
        return (math.isinf(a) and a == b) or abs(a - b) <= LOGPROB_TOL
    return a == b


def tree_diffs(ours: Any, theirs: Any, values: bool, path: str = "", key: str = "") -> list[Diff]:
    """Recursive key/type skeleton comparison; with values, also the VALUE_KEYS and logprobs values."""
    if json_type(ours) != json_type(theirs):
        return [Diff("skeleton", path or ".", json_type(ours), json_type(theirs))]
    checked = VALUE_KEYS | LOGPROB_KEYS if values else SHAPE_VALUE_KEYS
    if isinstance(ours, dict):
        out = [Diff("skeleton", f"{path}.{k}", "missing", json_type(theirs[k])) for k in theirs if k not in ours]
        out += [Diff("skeleton", f"{path}.{k}", json_type(ours[k]), "missing") for k in ours if k not in theirs]
        for k in ours.keys() & theirs.keys():
            out += tree_diffs(ours[k], theirs[k], values, f"{path}.{k}", k)
        return out
    if isinstance(ours, list):
        out = []
        if key in checked and len(ours) != len(theirs):
            if all(not isinstance(x, dict | list) for x in (*ours, *theirs)):
                return [Diff("value", f"{path}", _short(ours), _short(theirs))]
            out.append(Diff("value", f"{path}.length", str(len(ours)), str(len(theirs))))
        for a, b in zip(ours, theirs, strict=False):
            out += tree_diffs(a, b, values, f"{path}[]", key)
        return out
    if key in checked and not _equal(key, ours, theirs):
        return [Diff("value", path, _short(ours), _short(theirs))]
    return []


def _fold_delta(acc: dict[str, Any], choice: dict[str, Any]) -> None:
    """Adds one stream chunk's choice to the text, ids, tool calls and logprobs accumulated so far."""
    delta = choice.get("delta") or {}
    for key in ("content", "reasoning", "reasoning_content"):
        if isinstance(delta.get(key), str):
            acc[key] = acc.get(key, "") + delta[key]
    if isinstance(choice.get("text"), str):
        acc["text"] = acc.get("text", "") + choice["text"]
    for key in ("token_ids", "prompt_token_ids"):
        if isinstance(choice.get(key), list):
            acc[key] = acc.get(key, []) + choice[key]
    for call in delta.get("tool_calls") or []:
        calls = acc.setdefault("tool_calls", {})
        entry = calls.setdefault(call.get("index", 0), {"name": "", "arguments": ""})
        fn = call.get("function") or {}
        entry["name"] += fn.get("name") or ""
        entry["arguments"] += fn.get("arguments") or ""
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):  # chat: {"content": [...]}; completions: tokens, token_logprobs, top_logprobs...
        joined = acc.setdefault("logprobs", {})
        for key, items in logprobs.items():
            if isinstance(items, list):
                joined[key] = joined.get(key, []) + items
    for key in ("finish_reason", "stop_reason"):
        if choice.get(key) is not None:
            acc[key] = choice[key]


def fold_stream(events: tuple[Any, ...]) -> dict[str, Any]:
    """A stream's meaning: per choice index the joined text, ids, tool calls and logprobs; the last usage."""
    choices: dict[int, dict[str, Any]] = {}
    usage = None
    for event in events:
        if not isinstance(event, dict):
            continue
        for choice in event.get("choices") or []:
            _fold_delta(choices.setdefault(choice.get("index", 0), {}), choice)
        if event.get("usage") is not None:
            usage = event["usage"]
    folded = {str(i): choices[i] for i in sorted(choices)}
    for acc in folded.values():
        if "tool_calls" in acc:
            acc["tool_calls"] = [acc["tool_calls"][i] for i in sorted(acc["tool_calls"])]
    return {"choices": folded, "usage": usage, "done": events[-1:] == ("[DONE]",)}


def _signature(event: Any) -> str:
    """A chunk's shape for the event sequence: its key skeleton with delta keys, values dropped."""
    def skel(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: skel(v) for k, v in sorted(x.items())}
        if isinstance(x, list):  # a list of scalars is an array whatever it holds (bytes may be empty)
            return [skel(x[0])] if x and isinstance(x[0], (dict, list)) else "array"
        return json_type(x)
    return json.dumps(skel(event), sort_keys=True) if event != "[DONE]" else "[DONE]"


def _without(event: dict[str, Any], ignored: frozenset[str]) -> dict[str, Any]:
    """The event without the keys named in `ignored`: top-level names, or dotted paths one level down (usage.x)."""
    out = {k: v for k, v in event.items() if k not in ignored}
    for path in ignored:
        head, _, tail = path.partition(".")
        if tail and isinstance(out.get(head), dict):
            out[head] = {k: v for k, v in out[head].items() if k != tail}
    return out


def event_sequence(events: tuple[Any, ...], ignored: frozenset[str] = frozenset()) -> list[str]:
    """Chunk shapes with consecutive repeats collapsed: how many tokens each chunk carried does not count; top-level
    keys in `ignored` (documented extensions) are left out."""
    seq: list[str] = []
    for event in events:
        if isinstance(event, dict) and ignored:
            event = _without(event, ignored)
        sig = _signature(event)
        if not seq or seq[-1] != sig:
            seq.append(sig)
    return seq


ENDING_KEYS = ("finish_reason", "stop_reason")  # a choice's keys that the later of two joined chunks decides


def _join_values(older: Any, newer: Any) -> Any:
    if isinstance(older, dict) and isinstance(newer, dict):
        return {**older, **{k: _join_values(older.get(k), v) for k, v in newer.items()}}
    return older if newer is None or newer == {} else newer if older is None or older == {} else older


def join_chunks(older: dict[str, Any], newer: dict[str, Any]) -> dict[str, Any]:
    """Two chunks of one choice as one: the union of their keys (a delta's text, tool calls, logprobs, ids), the
    newer chunk's ending keys and fingerprint."""
    a, b = older["choices"][0], newer["choices"][0]
    choice = {**_join_values(a, b), **{k: b[k] for k in ENDING_KEYS if k in b}}
    top = {**_join_values({k: v for k, v in older.items() if k != "choices"},
                          {k: v for k, v in newer.items() if k != "choices"}),
           **{k: newer[k] for k in ("system_fingerprint", "usage") if k in newer}}
    return {**top, "choices": [choice]}


def joined_stream(events: tuple[Any, ...]) -> list[Any]:
    """A stream with each choice's content chunks joined into one (in order of first appearance): how finely a
    server cuts a stream depends on how fast its engine runs against its reader (vLLM also joins what its reader
    has not taken yet, and sends an empty delta for a token whose text it holds back), not on the API. Role
    chunks, chunks without choices (usage) and [DONE] stay as they are."""
    head: list[Any] = []
    joined: dict[Any, dict[str, Any]] = {}
    tail: list[Any] = []
    for event in events:
        choices = event.get("choices") if isinstance(event, dict) else None
        if not choices or len(choices) != 1 or "role" in (choices[0].get("delta") or {}):
            (tail if joined or not isinstance(event, dict) or not choices else head).append(event)
            continue
        index = choices[0].get("index")
        joined[index] = join_chunks(joined[index], event) if index in joined else event
    return [*head, *joined.values(), *tail]


def sse_diffs(ours: tuple[Any, ...], theirs: tuple[Any, ...], values: bool,
              ours_only: frozenset[str] = frozenset()) -> list[Diff]:
    out = tree_diffs(fold_stream(ours), fold_stream(theirs), values, "stream")
    a = event_sequence(tuple(joined_stream(ours)), ours_only)
    b = event_sequence(tuple(joined_stream(theirs)))
    if a != b:
        i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        first_a, first_b = (a[i] if i < len(a) else "end"), (b[i] if i < len(b) else "end")
        out.append(Diff("sse", f"events[{i}]", first_a, first_b))
    return out


def compare(ours: Reply, theirs: Reply, greedy: bool, ours_only: frozenset[str] = frozenset()) -> list[Diff]:
    """Everything that differs between two replies to one case (greedy: values too, not only shapes); `ours_only`:
    top-level keys of our stream chunks that are documented extensions, left out of the event shapes."""
    if ours.status != theirs.status:
        return [Diff("status", "status", str(ours.status), str(theirs.status))]
    if (ours.events is None) != (theirs.events is None):
        return [Diff("sse", "stream", str(ours.events is not None), str(theirs.events is not None))]
    if ours.events is not None and theirs.events is not None:
        return sse_diffs(ours.events, theirs.events, greedy and ours.status == 200, ours_only)
    return tree_diffs(ours.body, theirs.body, greedy and ours.status == 200, "body")
