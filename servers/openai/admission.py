"""Cheap checks before costly work: text length against the context, sequences per request, stop strings."""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from typing import Any

from servers.openai.replies import ApiError

MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
MAX_LOGIT_BIAS = 2048
_SURROGATE = re.compile("[\ud800-\udfff]")


@cache
def _longest_token_chars(tokenizer: Any) -> int:
    """An upper bound on the characters one token can stand for: the longest vocabulary entry (byte-level BPE
    spells each byte as one character, so an entry never decodes to more characters than it has)."""
    backend = getattr(tokenizer, "backend", None)  # ours wraps a `tokenizers` Tokenizer; HF's has get_vocab()
    vocab = backend.get_vocab(with_added_tokens=True) if backend is not None else tokenizer.get_vocab()
    return max([len(k) for k in vocab] + [1])


def text_char_limit(tokenizer: Any, max_model_len: int) -> int:
    """More characters than this cannot fit in max_model_len tokens, whatever they are."""
    return max_model_len * _longest_token_chars(tokenizer)


def check_text(tokenizer: Any, max_model_len: int, texts: Iterable[str], param: str) -> None:
    """400 before tokenizing: text too long for the context by character count alone, or not valid Unicode."""
    texts = list(texts)
    chars = sum(len(t) for t in texts)
    limit = text_char_limit(tokenizer, max_model_len)
    if chars > limit:
        raise ApiError(400, f"the request has {chars} characters of text, more than the {max_model_len}-token "
                       f"context can hold (at most {limit} characters); shorten the prompt", param=param)
    for text in texts:
        if (m := _SURROGATE.search(text)) is not None:
            raise ApiError(400, f"the text has a lone UTF-16 surrogate ({ascii(m.group())}) at character {m.start()}: "
                           "it is not valid Unicode", param=param)


def check_sequences(num_prompts: int, n: int, limit: int) -> None:
    if num_prompts * n > limit:
        raise ApiError(400, f"{num_prompts} prompt(s) x n={n} is {num_prompts * n} sequences, over this server's "
                       f"limit of {limit} per request (--max-sequences-per-request)", param="n")


def check_stops(stop: str | list[str] | None) -> None:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise ApiError(400, f"{len(stops)} stop strings, over the limit of {MAX_STOP_STRINGS}", param="stop")
    if long := [s for s in stops if len(s) > MAX_STOP_CHARS]:
        raise ApiError(400, f"a stop string of {len(long[0])} characters is over the limit of {MAX_STOP_CHARS}",
                       param="stop")
    if any(_SURROGATE.search(s) for s in stops):
        raise ApiError(400, "a stop string has a lone UTF-16 surrogate: it is not valid Unicode", param="stop")


def check_logit_bias(bias: dict[str, float] | None) -> None:
    if bias and len(bias) > MAX_LOGIT_BIAS:
        raise ApiError(400, f"logit_bias has {len(bias)} entries, over the limit of {MAX_LOGIT_BIAS}",
                       param="logit_bias")


def message_texts(messages: list[Any]) -> list[str]:
    """Every piece of text in chat messages (content strings and text parts, reasoning, tool-call arguments)."""
    out: list[str] = []
    for m in messages:
        if isinstance(m.content, str):
            out.append(m.content)
        elif m.content:
            out += [p.text for p in m.content if hasattr(p, "text")]
        out += [m.reasoning_content or "", *(c.function.arguments for c in m.tool_calls or [])]
    return out
