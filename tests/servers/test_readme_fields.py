"""servers/openai/README.md's field table against the request models: each field exists, refusals and ignores hold."""

from __future__ import annotations

import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.requests import ChatCompletionRequest, CompletionRequest, TokenizeRequest
from servers.openai.bodies.sampling_params import to_sampling_params
from servers.openai.endpoints.responses_api.build import _check_supported
from servers.openai.endpoints.responses_api.protocol import ResponsesRequest
from servers.openai.media.options import media_io_video

README = Path(__file__).resolve().parents[2] / "servers" / "openai" / "README.md"
MODELS: dict[str, type[BaseModel]] = {"chat": ChatCompletionRequest, "compl.": CompletionRequest,
                                      "responses": ResponsesRequest, "tokenize": TokenizeRequest}
WHERE_ALL = ("chat", "compl.", "responses")  # "all": the generation endpoints
BASE: dict[str, dict[str, Any]] = {"chat": {"messages": [{"role": "user", "content": "hi"}]},
                                   "compl.": {"prompt": "hi"}, "responses": {"input": "hi"}, "tokenize": {}}
VOCAB = 1000

# a value each refused field is refused at (README: "a 400 ..."); the test checks it is, naming the field
REFUSE: dict[tuple[str, str], Any] = {
    ("chat", "top_logprobs"): -1, ("chat", "prompt_logprobs"): 21, ("chat", "truncate_prompt_tokens"): 0,
    ("chat", "routed_experts_prompt_start"): -1, ("compl.", "routed_experts_prompt_start"): -1,
    ("chat", "use_beam_search"): True, ("chat", "allowed_token_ids"): [1], ("chat", "bad_words"): ["x"],
    ("chat", "priority"): 1, ("chat", "logits_processors"): ["a.b"], ("chat", "kv_transfer_params"): {"x": 1},
    ("chat", "max_repetition_pattern_size"): 4, ("chat", "min_repetition_pattern_size"): 2,
    ("chat", "repetition_min_count"): 3, ("chat", "media_io_kwargs"): {"video": {"size": 1}},
    ("compl.", "suffix"): "tail", ("compl.", "prompt_embeds"): "AAAA", ("compl.", "best_of"): 2,
    ("chat", "best_of"): 2, ("chat", "stream_options.include_usage"): True,  # stream_options without stream: 400
    ("compl.", "stream_options.include_usage"): True,
    ("chat", "modalities"): ["text", "audio"], ("chat", "audio"): {"voice": "alloy", "format": "wav"},
    ("chat", "web_search_options"): {}, ("chat", "functions"): [{"name": "f"}],
    ("chat", "function_call"): {"name": "f"}, ("responses", "prompt"): {"id": "pmpt_1"},
    ("responses", "enable_response_messages"): True, ("responses", "previous_input_messages"): [{"role": "user"}],
}
# a value each ignored field is ignored at: the request's SamplingParams are those of the request without it
IGNORE: dict[tuple[str, str], Any] = {
    ("chat", "user"): "u", ("compl.", "user"): "u", ("chat", "vllm_xargs"): {"a": 1},
    ("compl.", "vllm_xargs"): {"a": 1}, ("chat", "store"): True,
    ("chat", "metadata"): {"k": "v"}, ("chat", "service_tier"): "flex", ("chat", "prompt_cache_key"): "k",
    ("chat", "prompt_cache_retention"): "24h", ("chat", "safety_identifier"): "s", ("chat", "verbosity"): "low",
    ("chat", "prediction"): {"type": "content", "content": "x"},
    ("chat", "stream_options.include_obfuscation"): True, ("compl.", "stream_options.include_obfuscation"): False,
    ("responses", "stream_options.include_obfuscation"): True, ("responses", "store"): True,
    ("responses", "metadata"): {"k": "v"}, ("responses", "user"): "u", ("responses", "prompt_cache_key"): "k",
    ("responses", "prompt_cache_retention"): "in_memory", ("responses", "safety_identifier"): "s",
}
IGNORED_VERDICT = re.compile(r"ignored|change(s)? nothing|treated as")
REFUSED_VERDICT = re.compile(r"\b400s?\b")


def table() -> list[tuple[list[list[str]], tuple[str, ...], str]]:
    """(fields, where, verdict) per row; each field is a list of alternatives (`messages` / `prompt`)."""
    section = README.read_text().split("## vLLM's request surface")[1].split("\n## ")[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if not line.startswith("| `") or len(cells) != 3:
            continue
        fields = [[re.split(r"[:\s]", t, maxsplit=1)[0] for t in re.findall(r"`([^`]+)`", piece)]
                  for piece in cells[0].split(",")]
        where = tuple(w for part in cells[1].split(",")
                      for w in (WHERE_ALL if part.strip() == "all" else (part.strip(),)))
        rows.append(([f for f in fields if f], where, cells[2]))
    assert len(rows) > 40, "the field table was not found"
    return rows


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return next((m for a in typing.get_args(annotation) if (m := _nested_model(a))), None)
    return None


def has_field(model: type[BaseModel], dotted: str) -> bool:
    head, _, rest = dotted.partition(".")
    if head not in model.model_fields:
        return False
    if not rest:
        return True
    nested = _nested_model(model.model_fields[head].annotation)
    return nested is None or has_field(nested, rest)  # a dict-typed field (reasoning.effort) takes any key


def row_of(where: str, field: str) -> str:
    verdicts = [v for fields, ws, v in table() if where in ws and any(field in alts for alts in fields)]
    assert verdicts, f"{field} ({where}) is not in the README's table"
    return " ".join(verdicts)


def test_every_field_in_the_table_exists_where_it_says():
    missing = [(alts, where) for fields, ws, _ in table() for alts in fields for where in ws
               if not any(has_field(MODELS[where], name) for name in alts)]
    assert not missing, f"README fields the request models lack: {missing}"


def test_every_request_field_is_documented():
    text = README.read_text()
    undocumented = [(name, field) for name, model in MODELS.items() for field in model.model_fields
                    if not re.search(rf"`{re.escape(field)}[`.:\s]", text)]
    assert not undocumented, f"request fields the README never names: {undocumented}"


def test_refusals_and_ignores_match_the_verdicts():
    for fields, where, verdict in table():
        names = {(w, n) for alts in fields for n in alts for w in where}
        if REFUSED_VERDICT.search(verdict):
            assert names & REFUSE.keys(), f"{fields} is a 400 in the README, but no refusal is tested"
        if verdict.startswith("accepted and ignored"):
            assert names <= IGNORE.keys(), f"{sorted(names - IGNORE.keys())} are ignored in the README, not tested"
    for where, field in REFUSE:
        assert REFUSED_VERDICT.search(row_of(where, field)), f"{field} is refused, the README does not say so"
    for where, field in IGNORE:
        assert IGNORED_VERDICT.search(row_of(where, field)), f"{field} is ignored, the README does not say so"


def _body(where: str, field: str, value: Any) -> dict[str, Any]:
    head, _, rest = field.partition(".")
    return {**BASE[where], head: {rest: value} if rest else value}


def _refusal(where: str, field: str, value: Any) -> BaseException | None:
    try:
        req = MODELS[where](**_body(where, field, value))
        if field == "media_io_kwargs":
            media_io_video(req.media_io_kwargs, "media_io_kwargs")
        elif where == "responses":
            _check_supported(req)
        else:
            to_sampling_params(req, VOCAB)
    except (ApiError, ValidationError) as exc:
        return exc
    return None


@pytest.mark.parametrize("where,field", sorted(REFUSE))
def test_refused_fields_are_a_400_naming_them(where, field):
    exc = _refusal(where, field, REFUSE[where, field])
    assert exc is not None, f"{field}={REFUSE[where, field]!r} was accepted"
    if isinstance(exc, ApiError):
        param = exc.param or ""  # the field, a part of it, or the object holding it (stream_options)
        assert exc.status == 400 and param and (param.startswith(field) or field.startswith(param)), (
            exc.status, exc.param, exc.message)
    else:
        # a value refused, not an unknown field: "unrecognized" is no verdict of the table
        assert any(e["loc"][0] == field and e["type"] != "extra_forbidden" for e in exc.errors()), exc


@pytest.mark.parametrize("where,field", sorted(IGNORE))
def test_ignored_fields_change_nothing(where, field):
    streamed = {"stream": True} if field.startswith("stream_options") else {}  # vLLM: stream_options need a stream
    req = MODELS[where](**{**_body(where, field, IGNORE[where, field]), **streamed})
    if where != "responses":
        assert to_sampling_params(req, VOCAB) == to_sampling_params(MODELS[where](**BASE[where], **streamed), VOCAB)
