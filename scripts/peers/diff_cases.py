"""The differential suite's requests: a seeded generator of chat, completion, tokenizer, sweep and error cases."""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MEDIA = REPO / "assets" / "media"
IMAGE = MEDIA / "images" / "photo.png"
VIDEO = MEDIA / "videos" / "pan_h264_2fps_59.mp4"
MODEL = "tiny"  # both servers run with --served-model-name tiny

USER = [{"role": "user", "content": "Describe a quiet street."}]
PROMPTS = ["Once upon a time", "Count: 1 2 3", "The capital of France is", "def add(a, b):", "Q: why?\nA:", "hi"]
STOP_WORDS = ["the", "a", "\n", "example", ".", "ing"]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
          "required": ["n", "ok"], "additionalProperties": False}


@dataclass(frozen=True)
class Case:
    """One request: sent unchanged to both servers. greedy: ids and text must be equal, not only the shape."""
    name: str
    method: str
    path: str
    body: dict[str, Any] | None = None
    greedy: bool = True

    @property
    def stream(self) -> bool:
        return bool(self.body and self.body.get("stream"))


def _image_url() -> str:
    return "data:image/png;base64," + base64.b64encode(IMAGE.read_bytes()).decode()


def _messages(rng: random.Random) -> tuple[str, list[dict[str, Any]]]:
    """A named conversation: plain, with a system or developer turn, multi-turn, or with an image or a video."""
    kinds = {
        "plain": USER,
        "system": [{"role": "system", "content": "You are terse."}, *USER],
        "developer": [{"role": "developer", "content": "Answer in French."}, *USER],
        "turns": [*USER, {"role": "assistant", "content": "It is calm."}, {"role": "user", "content": "More?"}],
        "parts": [{"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "text", "text": "it"}]}],
        "image_file": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"file://{IMAGE}"}},
                                                    {"type": "text", "text": "What is it?"}]}],
        "image_data": [{"role": "user", "content": [{"type": "text", "text": "Colors?"},
                                                    {"type": "image_url", "image_url": {"url": _image_url()}}]}],
        "video": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": f"file://{VIDEO}"}},
                                               {"type": "text", "text": "What moves?"}]}],
    }
    name = rng.choice(sorted(kinds))
    return name, kinds[name]


def _sampling(rng: random.Random, body: dict[str, Any], chat: bool) -> list[str]:
    """Adds a random subset of vLLM's greedy-safe sampling fields to body; returns their names."""
    options: dict[str, Any] = {
        "stop": lambda: rng.sample(STOP_WORDS, rng.randint(1, 2)),
        "stop_token_ids": lambda: [rng.randint(10, 3000)],
        "min_tokens": lambda: rng.randint(1, 4),
        "n": lambda: rng.randint(2, 3),
        "seed": lambda: rng.randint(0, 99),
        "presence_penalty": lambda: rng.choice([0.5, 1.5]),
        "frequency_penalty": lambda: rng.choice([0.3, 1.0]),
        "repetition_penalty": lambda: rng.choice([1.1, 1.3]),
        "logit_bias": lambda: {str(rng.randint(10, 3000)): rng.choice([-100, 5])},
        "ignore_eos": lambda: True,
        "include_stop_str_in_output": lambda: True,
        "skip_special_tokens": lambda: False,
        "return_token_ids": lambda: True,
        "top_k": lambda: rng.choice([1, 5]),
        "top_p": lambda: 0.9,
        "user": lambda: "u1",
    }
    if chat:
        options["logprobs"] = lambda: True
        options["top_logprobs"] = lambda: rng.randint(0, 4)
    else:
        options["logprobs"] = lambda: rng.randint(0, 3)
        options["echo"] = lambda: True
        options["prompt_logprobs"] = lambda: rng.randint(0, 2)
    picked = rng.sample(sorted(options), rng.randint(0, 4))
    for key in picked:
        body[key] = options[key]()
    if "top_logprobs" in body:
        body["logprobs"] = True
    return picked


def _stream(rng: random.Random, body: dict[str, Any]) -> None:
    if rng.random() < 0.4:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": rng.random() < 0.3}


def chat_case(rng: random.Random, i: int) -> Case:
    kind, messages = _messages(rng)
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "temperature": 0,
                            rng.choice(["max_tokens", "max_completion_tokens"]): rng.randint(1, 20)}
    picked = _sampling(rng, body, chat=True)
    _stream(rng, body)
    return Case(f"chat.{i}.{kind}.{'+'.join(picked) or 'defaults'}", "POST", "/v1/chat/completions", body)


def completion_case(rng: random.Random, i: int) -> Case:
    prompt: Any = rng.choice(PROMPTS)
    if rng.random() < 0.2:
        prompt = [rng.randint(10, 3000) for _ in range(rng.randint(1, 6))]
    body: dict[str, Any] = {"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": rng.randint(1, 20)}
    picked = _sampling(rng, body, chat=False)
    _stream(rng, body)
    return Case(f"completion.{i}.{'+'.join(picked) or 'defaults'}", "POST", "/v1/completions", body)


def structured_case(rng: random.Random, i: int) -> Case:
    kinds = {
        "choice": {"structured_outputs": {"choice": ["yes", "no", "maybe"]}},
        "regex": {"structured_outputs": {"regex": "[a-z]{3,8}"}},
        "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
                        "structured_outputs": {"disable_any_whitespace": True}},
        "json_object": {"response_format": {"type": "json_object"}},
        "so_json": {"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}},
    }
    kind = rng.choice(sorted(kinds))
    body = {"model": MODEL, "messages": USER, "temperature": 0, "max_tokens": 24, **kinds[kind]}
    _stream(rng, body)
    return Case(f"structured.{i}.{kind}", "POST", "/v1/chat/completions", body)


def tool_case(rng: random.Random, i: int) -> Case:
    choice = rng.choice(["auto", "none", "required", "named"])
    tool_choice: Any = {"type": "function", "function": {"name": "get_weather"}} if choice == "named" else choice
    strict = rng.random() < 0.4  # a strict tool: its arguments follow its schema, and "auto" gets a grammar too
    tools = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS] if strict else TOOLS
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}], "temperature": 0,
            "max_tokens": 40, "tools": tools, "tool_choice": tool_choice}
    if rng.random() < 0.25:
        body["parallel_tool_calls"] = False
    _stream(rng, body)
    name = choice + (".strict" if strict else "") + (".single" if "parallel_tool_calls" in body else "")
    return Case(f"tools.{i}.{name}", "POST", "/v1/chat/completions", body)


def reasoning_case(rng: random.Random, i: int) -> Case:
    extra = rng.choice([{}, {"structured_outputs": {"regex": "abc</think>defghijkl"}},
                        {"logit_bias": {"3009": 100}}, {"chat_template_kwargs": {"enable_thinking": False}}])
    body = {"model": MODEL, "messages": USER, "temperature": 0, "max_tokens": rng.randint(4, 30), **extra}
    _stream(rng, body)
    return Case(f"reasoning.{i}.{'+'.join(extra) or 'plain'}", "POST", "/v1/chat/completions", body)


def sampled_case(rng: random.Random, i: int) -> Case:
    """Temperature 1: the samplers differ, so only statuses and shapes are compared."""
    body = {"model": MODEL, "messages": USER, "temperature": 1.0, "max_tokens": 8, "seed": rng.randint(0, 9),
            "logprobs": True, "top_logprobs": 2}
    _stream(rng, body)
    return Case(f"sampled.{i}", "POST", "/v1/chat/completions", body, greedy=False)


NULLABLE = ["n", "stream", "logprobs", "echo", "presence_penalty", "frequency_penalty", "best_of",
            "return_token_ids", "return_tokens_as_token_ids", "stop", "seed", "max_tokens", "temperature", "top_p",
            "user", "logit_bias", "stream_options", "suffix"]
CHAT_NULLABLE = ["n", "stream", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty", "stop", "seed",
                 "max_tokens", "max_completion_tokens", "temperature", "top_p", "user", "tools", "tool_choice",
                 "response_format", "logit_bias", "stream_options", "return_token_ids", "parallel_tool_calls",
                 "reasoning_effort"]
OPENAI_FIELDS: dict[str, Any] = {
    "store": False, "metadata": {"k": "v"}, "service_tier": "auto", "prompt_cache_key": "k", "safety_identifier": "s",
    "verbosity": "low", "prediction": {"type": "content", "content": "x"}, "best_of": 1, "modalities": ["text"],
    "audio": None, "web_search_options": None, "parallel_tool_calls": True,
    "stream_options": {"include_usage": True, "include_obfuscation": False}}


def sweep_cases() -> list[Case]:
    """One field at a time: sent as null, and OpenAI's own fields with a value."""
    # a null temperature is the default (1.0: sampled), so that case compares shapes only
    cases = [Case(f"null.completion.{k}", "POST", "/v1/completions",
                  {"model": MODEL, "prompt": "hi", "max_tokens": 4, "temperature": 0, k: None},
                  greedy=k != "temperature") for k in NULLABLE]
    base = {"model": MODEL, "messages": USER, "max_tokens": 4, "temperature": 0}
    cases += [Case(f"null.chat.{k}", "POST", "/v1/chat/completions", {**base, k: None}, greedy=k != "temperature")
              for k in CHAT_NULLABLE]
    cases += [Case(f"openai.{k}", "POST", "/v1/chat/completions", {**base, k: v}) for k, v in OPENAI_FIELDS.items()]
    return cases


def tokenizer_cases() -> list[Case]:
    cases = [Case("models", "GET", "/v1/models"), Case("health", "GET", "/health")]
    for i, prompt in enumerate(["hi a\n", "", "Once upon a time"]):
        for strs in (False, True):
            cases.append(Case(f"tokenize.prompt.{i}.{strs}", "POST", "/tokenize",
                              {"model": MODEL, "prompt": prompt, "return_token_strs": strs}))
    for i, extra in enumerate([{}, {"add_generation_prompt": False}, {"continue_final_message": True,
                                                                     "add_generation_prompt": False}]):
        messages = [*USER, {"role": "assistant", "content": "It"}] if "continue_final_message" in extra else USER
        cases.append(Case(f"tokenize.chat.{i}", "POST", "/tokenize", {"model": MODEL, "messages": messages, **extra}))
    for i, tokens in enumerate([[1, 2, 3], [], [300, 301]]):
        cases.append(Case(f"detokenize.{i}", "POST", "/detokenize", {"model": MODEL, "tokens": tokens}))
    return cases


ERRORS: list[tuple[str, str, dict[str, Any]]] = [
    ("max_tokens_negative", "/v1/chat/completions", {"messages": USER, "max_tokens": -1}),
    ("temperature_negative", "/v1/chat/completions", {"messages": USER, "temperature": -1}),
    ("n_zero", "/v1/completions", {"prompt": "hi", "n": 0}),
    ("top_logprobs_too_many", "/v1/chat/completions", {"messages": USER, "logprobs": True, "top_logprobs": 30}),
    ("no_messages", "/v1/chat/completions", {}),
    ("bad_role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}),
    ("unknown_model", "/v1/chat/completions", {"messages": USER, "model": "gpt-4o"}),
    ("no_prompt", "/v1/completions", {"max_tokens": 2}),
    ("messages_not_list", "/v1/chat/completions", {"messages": "hi"}),
    ("top_p_zero", "/v1/completions", {"prompt": "hi", "top_p": 0}),
    ("image_missing_file", "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"file://{MEDIA}/images/none.png"}}]}]}),
    ("image_bad_data", "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}),
    ("prompt_too_long", "/v1/completions", {"prompt": "hi " * 3000, "max_tokens": 2}),
    ("beam_search", "/v1/completions", {"prompt": "hi", "use_beam_search": True}),
    ("tokenize_nothing", "/tokenize", {}),
]


def error_cases() -> list[Case]:
    return [Case(f"error.{name}", "POST", path, {"model": MODEL, **body}) for name, path, body in ERRORS]


GENERATORS = [(chat_case, 0.45), (completion_case, 0.3), (structured_case, 0.1), (sampled_case, 0.03),
              (tool_case, 0.06), (reasoning_case, 0.06)]


def generate(n: int, seed: int = 0, setups: tuple[str, ...] = ()) -> list[Case]:
    """n random cases (only those the given server setups can answer), then every sweep, tokenizer and error case."""
    rng = random.Random(seed)
    makers = [(m, w) for m, w in GENERATORS if not _setup_of(m) or _setup_of(m) in setups]
    cases = [rng.choices([m for m, _ in makers], [w for _, w in makers])[0](rng, i) for i in range(n)]
    return cases + sweep_cases() + tokenizer_cases() + error_cases()


def _setup_of(maker) -> str | None:
    return {tool_case: "tools", reasoning_case: "reasoning"}.get(maker)
