"""Records what vLLM's `qwen3_coder` tool parser makes of fixed texts (run in the vLLM peer's venv) as the JSON
tests/servers/test_qwen3_coder_tools.py holds ours to; CI has no peer, so the JSON is committed.

    HF_HUB_OFFLINE=1 .peers/vllm-venv/bin/python scripts/peers/record_qwen3_coder_tools.py
"""
# ruff: noqa: E501  (the cases are model texts, one a line)
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "golden" / "qwen3_coder_tools" / "vllm.json"
TOKENIZER = ROOT / "assets" / "models" / "tiny-qwen3.5"
PROPS = {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
         "t": {"type": "number"}, "opts": {"type": "object"}, "tags": {"type": "array"},
         "maybe": {"type": ["integer", "null"]}, "unit": {"enum": ["c", "f", 1]}, "n": {"type": "int"},
         "x": {"anyOf": [{"type": "number"}, {"type": "string"}]}, "f": {"type": "float"}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": PROPS}}},
         {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
             "path": {"type": "string"}, "content": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "ping"}}]


def call(name: str, *params: tuple[str, str], close: bool = True) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n" + ("</tool_call>" if close else "")


W = call("get_weather", ("city", "Paris"), ("days", "3"))
CASES = {
    "plain_text": "Just an answer, no call.",
    "plain_text_trailing_blanks": "Answer with blanks  \n\n",
    "one_call": W,
    "content_before": "Let me check.\n" + W,
    "content_after": W + "\nDone.",
    "content_between": W + "\nand also\n" + call("get_weather", ("city", "Rome")),
    "two_calls": W + "\n" + call("write_file", ("path", "a.py"), ("content", "print(1)")),
    "two_functions_one_block": "<tool_call>\n<function=ping>\n</function>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
    "no_close_between_calls": call("ping", close=False) + call("get_weather", ("days", "5")),
    "bare_function": "Sure <function=get_weather>\n<parameter=days>\n7\n</parameter>\n</function>",
    "types": call("get_weather", ("city", "  spaced  "), ("metric", "True"), ("t", "2.50"), ("opts", '{"a": [1, 2]}'),
                  ("tags", '["x", 2]'), ("maybe", "null"), ("unit", "1"), ("n", "42"), ("x", "1e3"), ("f", "7")),
    "types_that_fail": call("get_weather", ("days", "three"), ("metric", "yes"), ("t", "inf"), ("opts", "{bad"),
                            ("tags", "1"), ("maybe", "3.5"), ("n", "4.0")),
    "booleans_as_digits": call("get_weather", ("metric", "0")),
    "integer_with_blanks": call("get_weather", ("days", " 12 ")),
    "unknown_parameter": call("get_weather", ("color", "12"), ("city", "12")),
    "unknown_tool": call("search", ("q", "12"), ("k", "true")),
    "tool_without_parameters": call("ping", ("anything", "1")),
    "multiline_code": call("write_file", ("path", "m.py"), ("content", 'def f(x):\n    return "q\\"uote" < 3 > 2\n\n')),
    "unicode": call("write_file", ("path", "é.txt"), ("content", "naïve ✓ 漢字")),
    "duplicate_parameter": call("get_weather", ("city", "A"), ("days", "1"), ("city", "B")),
    "empty_parameter": call("get_weather", ("city", "")),
    "unclosed_parameter_then_next": "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
    "tight_markup": "<tool_call><function=get_weather><parameter=days>4</parameter></function></tool_call>",
    "name_with_blanks": "<tool_call>\n<function= get_weather >\n<parameter=days>\n4\n</parameter>\n</function>\n</tool_call>",
    "parameter_name_blanks": "<tool_call>\n<function=get_weather>\n<parameter= days >\n4\n</parameter>\n</function>\n</tool_call>",
    "truncated_in_value": "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
    "truncated_after_parameter": "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n",
    "truncated_in_name": "I will call <tool_call>\n<function=get_wea",
    "truncated_in_tag": "I will call <tool_ca",
    "hermes_json_in_block": 'Here: <tool_call>\n{"name": "get_weather", "arguments": {"days": 1}}\n</tool_call> tail',
    "empty_name": "<tool_call>\n<function=>\n<parameter=days>\n1\n</parameter>\n</function>\n</tool_call>",
    "empty_block": "a <tool_call></tool_call> b",
    "think_end_in_content": "x </think> y " + W,
    "stray_closers_in_content": "a </tool_call> b </function> c > d </parameter>",
    "tool_call_inside_args": "<tool_call>\n<function=write_file>\n<parameter=content>\n<tool_call>x</tool_call>\n</parameter>\n</function>\n</tool_call>",
    "no_function_close": "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</tool_call>\nafter",
}


def _joined(deltas: list[dict]) -> dict:
    calls: dict[int, list[str]] = {}
    for d in deltas:
        for tc in d.get("tool_calls") or []:
            entry = calls.setdefault(tc["index"], ["", ""])
            fn = tc.get("function") or {}
            entry[0] += fn.get("name") or ""
            entry[1] += fn.get("arguments") or ""
    return {"content": "".join(d.get("content") or "" for d in deltas), "calls": list(calls.values())}


def main() -> None:
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    cls = ParserManager.get_parser(tool_parser_name="qwen3_coder", enable_auto_tools=True, tokenizer=tokenizer)

    def request() -> ChatCompletionRequest:
        return ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], model="m", tools=TOOLS,
                                     tool_choice="auto")

    cases = []
    for name, text in CASES.items():
        _, content, calls = cls(tokenizer, TOOLS).parse(text, request(), enable_auto_tools=True)
        parser, req, deltas = cls(tokenizer, TOOLS), request(), []
        for i, ch in enumerate(text):  # char by char, text only (our server's parsers see text)
            d = parser.parse_delta(ch, [], req, prompt_token_ids=[0], finished=i == len(text) - 1)
            deltas += [d.model_dump(exclude_none=True)] if d is not None else []
        cases.append({"name": name, "text": text,
                      "whole": {"content": content, "calls": [[c.name, c.arguments] for c in calls or []]},
                      "streamed": _joined(deltas)})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"tools": TOOLS, "cases": cases}, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
