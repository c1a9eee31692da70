"""Engine outputs to response fields: logprobs (chat and legacy shapes), prompt logprobs and usage."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from mm_infer.engine.outputs.request_output import CompletionOutput, RequestOutput
from servers.openai.bodies.replies import CompletionLogprobs, TokenLogprob, TopLogprob, Usage

LOGPROB_FLOOR = -9999.0  # what a -inf logprob (a masked token) is sent as: JSON has no infinity (vLLM's convention)


def json_logprob(lp: float) -> float:
    return lp if math.isfinite(lp) else LOGPROB_FLOOR


def json_logprobs(lps: list[float]) -> list[float]:
    return [lp if math.isfinite(lp) else LOGPROB_FLOOR for lp in lps]


PARTIAL = "\ufffd"  # what a decode shows for an incomplete UTF-8 sequence
CONTEXT_TOKENS = 4  # preceding sampled tokens tried to complete a partial character (vLLM's bound)


def _completed(tokenizer: Any, token_id: int, context: Sequence[int]) -> str:
    """vLLM's text for a token whose own decode ends in a partial character: the character(s) it completes with up
    to 4 preceding sampled tokens (less what those tokens showed themselves), or "" when none completes it."""
    for n in range(1, min(len(context), CONTEXT_TOKENS) + 1):
        ctx = list(context[-n:])
        full = tokenizer.decode(ctx + [token_id], skip_special_tokens=False)
        if full.endswith(PARTIAL):
            continue
        clean_end = len(ctx)  # context tokens that were partial themselves gave "": their bytes are this token's
        while clean_end > 0 and tokenizer.decode([ctx[clean_end - 1]], skip_special_tokens=False).endswith(PARTIAL):
            clean_end -= 1
        clean = tokenizer.decode(ctx[:clean_end], skip_special_tokens=False) if clean_end else ""
        return full[len(os.path.commonprefix([clean, full])):]
    return ""


def token_str(tokenizer: Any, token_id: int, as_id: bool, context: Sequence[int] = ()) -> str:
    """A token as logprobs show it: its text, or `token_id:N` (vLLM's return_tokens_as_token_ids). A token that
    ends in a partial UTF-8 character shows what vLLM shows (`_completed`, with the sampled tokens before it)."""
    if as_id:
        return f"token_id:{token_id}"
    text = tokenizer.decode([token_id], skip_special_tokens=False)
    return _completed(tokenizer, token_id, context) if text.endswith(PARTIAL) else text


def _top(tokenizer: Any, alts: dict[int, float] | None, k: int, as_ids: bool,
         context: Sequence[int] = ()) -> list[tuple[str, float]]:
    ranked = sorted((alts or {}).items(), key=lambda kv: -kv[1])[:k]
    return [(token_str(tokenizer, t, as_ids, context), json_logprob(lp)) for t, lp in ranked]


def _utf8(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


def chat_logprobs(tokenizer: Any, comp: CompletionOutput, start: int, k: int, as_ids: bool,
                  before: Sequence[int] = ()) -> list[TokenLogprob]:
    """OpenAI chat `logprobs.content` for tokens [start:] of one sample (`before`: the sampled tokens ahead of the
    first, in a stream's earlier chunks)."""
    out = []
    ids = [*before[-CONTEXT_TOKENS:], *comp.token_ids]
    shift = len(ids) - len(comp.token_ids)
    for i in range(start, len(comp.token_ids)):
        context = ids[max(0, shift + i - CONTEXT_TOKENS):shift + i]
        token = token_str(tokenizer, comp.token_ids[i], as_ids, context)
        alts = comp.top_logprobs[i] if comp.top_logprobs and i < len(comp.top_logprobs) else None
        top = _sampled_first(comp.token_ids[i], comp.logprobs[i], alts, k)
        out.append(TokenLogprob(token=token, logprob=json_logprob(comp.logprobs[i]), bytes=_utf8(token),
                                top_logprobs=[TopLogprob(token=t, logprob=json_logprob(lp), bytes=_utf8(t))
                                              for t, lp in ((token if tid == comp.token_ids[i] else
                                                             token_str(tokenizer, tid, as_ids, context), lp)
                                                            for tid, lp in top)]))
    return out


def _sampled_first(token: int, lp: float, alts: dict[int, float] | None, k: int) -> list[tuple[int, float]]:
    """A chat entry's top_logprobs as vLLM lists them: the sampled token first, then the top alternatives by
    rank without it, k in all. The sampled token is the top one unless penalties, a bias, truncation or the draw
    moved it, so only then does this differ from the plain top k."""
    if k <= 0:
        return []
    ranked = [(t, v) for t, v in sorted((alts or {}).items(), key=lambda kv: -kv[1]) if t != token]
    return [(token, lp), *ranked][:k]


def _with_sampled(tokenizer: Any, token: int, lp: float | None, alts: dict[int, float] | None, k: int,
                  as_ids: bool, context: Sequence[int]) -> dict[str, float] | None:
    """vLLM's legacy top_logprobs entry: the chosen token first, then the top k (k = 0: the chosen token alone)."""
    if lp is None:
        return None
    top = {token_str(tokenizer, token, as_ids, context): json_logprob(lp)}
    for t, alt in _top(tokenizer, alts, k, as_ids, context):
        top.setdefault(t, alt)
    return top


def legacy_logprobs(tokenizer: Any, ids: list[int], lps: list[float | None], alts: list[dict[int, float] | None],
                    k: int, as_ids: bool, at: int = 0, before: Sequence[int] = ()) -> CompletionLogprobs:
    """Legacy text-completion logprobs of `ids`: tokens, token_logprobs, top_logprobs, text_offset from `at`
    (`before`: the sampled tokens ahead of ids[0], which may complete its partial character)."""
    seq = [*before[-CONTEXT_TOKENS:], *ids]
    head = len(seq) - len(ids)
    contexts = [seq[max(0, head + i - CONTEXT_TOKENS):head + i] for i in range(len(ids))]
    tokens = [token_str(tokenizer, t, as_ids, ctx) for t, ctx in zip(ids, contexts, strict=True)]
    offsets = []
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return CompletionLogprobs(
        tokens=tokens, token_logprobs=[None if lp is None else json_logprob(lp) for lp in lps], text_offset=offsets,
        top_logprobs=[_with_sampled(tokenizer, t, lp, a, k, as_ids, ctx)
                      for t, lp, a, ctx in zip(ids, lps, alts, contexts, strict=True)])


def completion_logprobs(tokenizer: Any, comp: CompletionOutput, k: int, as_ids: bool, start: int = 0,
                        at: int = 0) -> CompletionLogprobs:
    """Legacy logprobs of generated tokens [start:], text offsets counted from `at`."""
    n = len(comp.token_ids)
    alts = [comp.top_logprobs[i] if comp.top_logprobs and i < len(comp.top_logprobs) else None for i in range(start, n)]
    return legacy_logprobs(tokenizer, comp.token_ids[start:], list(comp.logprobs[start:]), alts, k, as_ids, at,
                           comp.token_ids[:start])


def echo_logprobs(tokenizer: Any, out: RequestOutput, k: int, as_ids: bool) -> CompletionLogprobs:
    """Legacy logprobs of the prompt tokens (echo): the first has none."""
    ids = list(out.prompt_token_ids)
    lps = list(out.prompt_logprobs or [None] * len(ids))
    alts = list(out.prompt_top_logprobs or [None] * len(ids))
    return legacy_logprobs(tokenizer, ids, lps, alts, k, as_ids)


def join_logprobs(head: CompletionLogprobs, tail: CompletionLogprobs) -> CompletionLogprobs:
    """head's tokens then tail's, tail's text offsets moved past head's text."""
    shift = head.text_offset[-1] + len(head.tokens[-1]) if head.tokens else 0
    return CompletionLogprobs(tokens=head.tokens + tail.tokens,
                              token_logprobs=head.token_logprobs + tail.token_logprobs,
                              top_logprobs=(head.top_logprobs or []) + (tail.top_logprobs or []),
                              text_offset=head.text_offset + [o + shift for o in tail.text_offset])


def prompt_logprobs(tokenizer: Any, out: RequestOutput, as_ids: bool) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM shape: None for the first prompt token, then {token_id: {logprob, rank, decoded_token}}: the prompt
    token itself (its real rank, 1 = the most likely), then the top k alternatives (ranks 1..k)."""
    lps = out.prompt_logprobs or []
    ranks = out.prompt_ranks or []
    tops = out.prompt_top_logprobs or []
    result: list[dict[str, dict[str, Any]] | None] = []
    for i, token in enumerate(out.prompt_token_ids):
        lp = lps[i] if i < len(lps) else None
        if lp is None:
            result.append(None)
            continue
        entry = {str(token): {"logprob": json_logprob(lp), "rank": ranks[i] if i < len(ranks) else None,
                              "decoded_token": token_str(tokenizer, token, as_ids)}}
        ranked = sorted((tops[i] if i < len(tops) and tops[i] else {}).items(), key=lambda kv: -kv[1])
        for r, (alt, alt_lp) in enumerate(ranked, start=1):
            entry.setdefault(str(alt), {"logprob": json_logprob(alt_lp), "rank": r,
                                        "decoded_token": token_str(tokenizer, alt, as_ids)})
        result.append(entry)
    return result


def running_usage(options: Any, prompt_tokens: int) -> Callable[[int], Usage | None]:
    """vLLM's stream_options.continuous_usage_stats (with include_usage): usage so far on every chunk."""
    on = options is not None and options.include_usage and options.continuous_usage_stats

    def so_far(generated: int) -> Usage | None:
        if not on:
            return None
        return Usage(prompt_tokens=prompt_tokens, completion_tokens=generated, total_tokens=prompt_tokens + generated)
    return so_far


def usage(out: RequestOutput) -> Usage:
    generated = sum(len(c.token_ids) for c in out.outputs)
    prompt = len(out.prompt_token_ids)
    return Usage(prompt_tokens=prompt, completion_tokens=generated, total_tokens=prompt + generated,
                 prompt_tokens_details={"cached_tokens": out.num_cached_tokens})
