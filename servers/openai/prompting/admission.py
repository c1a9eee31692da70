"""Cheap checks before costly work: text (sent and rendered) against the context, sequences, stops, answer size."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from functools import cache
from typing import Any

from mm_infer.engine.sampling.params import SamplingParams
from servers.openai.bodies.errors import ApiError

MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
MAX_LOGIT_BIAS = 2048
MAX_LOGIT_BIAS_VALUE = 100.0  # OpenAI's range, [-100, 100]
MAX_TEMPLATE_CHARS = 256 * 1024  # a request's own chat_template (checkpoints' templates run to ~20 KB)
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


def check_rendered(tokenizer: Any, max_model_len: int, text: str, param: str) -> None:
    """400 before tokenizing a rendered chat template whose text cannot fit the context by length alone."""
    limit = text_char_limit(tokenizer, max_model_len)
    if len(text) > limit:
        raise ApiError(400, f"the rendered chat template is {len(text)} characters, more than the "
                       f"{max_model_len}-token context can hold (the cap is {limit} characters); shorten the messages "
                       "or the template",
                       param=param)


def check_sequences(num_prompts: int, n: int, limit: int) -> None:
    if num_prompts * n > limit:
        raise ApiError(400, f"{num_prompts} prompt(s) x n={n} is {num_prompts * n} sequences, over this server's "
                       f"limit of {limit} per request (--max-sequences-per-request)", param="n")


def check_stops(stop: str | list[str] | None, param: str = "stop") -> None:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise ApiError(400, f"{len(stops)} stop strings, over the limit of {MAX_STOP_STRINGS}", param=param)
    if long := [s for s in stops if len(s) > MAX_STOP_CHARS]:
        raise ApiError(400, f"a stop string of {len(long[0])} characters is over the limit of {MAX_STOP_CHARS}",
                       param=param)
    if any(_SURROGATE.search(s) for s in stops):
        raise ApiError(400, "a stop string has a lone UTF-16 surrogate: it is not valid Unicode", param=param)


def check_logit_bias(bias: Mapping[Any, float] | None, param: str = "logit_bias") -> None:
    """At most MAX_LOGIT_BIAS entries, each value in [-100, 100] (keys are checked where they are parsed)."""
    if not bias:
        return
    if len(bias) > MAX_LOGIT_BIAS:
        raise ApiError(400, f"logit_bias has {len(bias)} entries, over the limit of {MAX_LOGIT_BIAS}", param=param)
    for key, value in bias.items():
        if not -MAX_LOGIT_BIAS_VALUE <= value <= MAX_LOGIT_BIAS_VALUE:
            raise ApiError(400, f"logit_bias value {value} for token {key} is outside [-{MAX_LOGIT_BIAS_VALUE:g}, "
                           f"{MAX_LOGIT_BIAS_VALUE:g}]", param=param)


def clamp_lengths(params: SamplingParams, max_model_len: int) -> SamplingParams:
    """max_tokens and min_tokens past the whole context, clamped to it (the engine clamps again to what the prompt
    leaves): what reaches the engine is always a token count that fits. Ints past int64 are a 400 at the model."""
    over = {name: max_model_len for name in ("max_tokens", "min_tokens")
            if (getattr(params, name) or 0) > max_model_len}
    return replace(params, **over) if over else params


def _new_tokens(max_tokens: int | None, max_model_len: int, prompt_len: int | None) -> int:
    """The most tokens a sample can generate: max_tokens within what the prompt leaves of the context; for a prompt
    not yet tokenized (None), max_tokens alone (0 when it is not given: counted once the prompt is known)."""
    if prompt_len is None:
        return min(max_tokens or 0, max_model_len)
    room = max(max_model_len - prompt_len, 0)
    return room if max_tokens is None else min(max_tokens, room)


def check_answer_size(params: SamplingParams, max_model_len: int, limit: int, prompt_lens: Sequence[int | None],
                      prompt_copies: int = 1, param: str = "logprobs") -> None:
    """400 when the logprobs an answer could carry exceed `limit` (--max-logprob-entries): per prompt, n samples x
    their most new tokens x (1 + top alternatives), plus prompt_copies x prompt length x (1 + prompt alternatives).
    A prompt length of None (not tokenized yet) counts only what max_tokens alone implies."""
    k, pk = params.logprobs, params.prompt_logprobs
    if k is None and pk is None:
        return
    total, parts = 0, []
    for plen in prompt_lens:
        new = _new_tokens(params.max_tokens, max_model_len, plen)
        if k is not None and new:
            total += params.n * new * (1 + k)
            parts.append(f"n={params.n} x {new} tokens x (1 + {k} top logprobs)")
        if pk is not None and plen:
            total += prompt_copies * plen * (1 + pk)
            parts.append(f"{prompt_copies} x {plen} prompt tokens x (1 + {pk} prompt logprobs)")
    if total > limit:
        shown = " + ".join(dict.fromkeys(parts)) if len(prompt_lens) == 1 else f"over {len(prompt_lens)} prompts"
        raise ApiError(400, f"the answer could carry {total} logprob entries ({shown}), over this server's limit of "
                       f"{limit} per request (--max-logprob-entries); lower n, max_tokens, the top logprobs or "
                       "prompt_logprobs", param=param)


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
