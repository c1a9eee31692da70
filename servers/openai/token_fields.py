"""Per-token response fields: chat and text-completion logprobs, prompt_logprobs, usage."""

from __future__ import annotations

from typing import Any

from mm_infer.engine.outputs import CompletionOutput, RequestOutput
from servers.openai.responses import CompletionLogprobs, TokenLogprob, TopLogprob, Usage
from servers.openai.state import ServerState


def _top(state: ServerState, alts: dict[int, float] | None, k: int, as_ids: bool) -> list[tuple[str, float]]:
    ranked = sorted((alts or {}).items(), key=lambda kv: -kv[1])[:k]
    return [(state.token_str(t, as_ids), lp) for t, lp in ranked]


def chat_logprobs(state: ServerState, comp: CompletionOutput, start: int, k: int, as_ids: bool) -> list[TokenLogprob]:
    """OpenAI chat `logprobs.content` for tokens [start:] of one sample."""
    out = []
    for i in range(start, len(comp.token_ids)):
        token = state.token_str(comp.token_ids[i], as_ids)
        alts = comp.top_logprobs[i] if comp.top_logprobs and i < len(comp.top_logprobs) else None
        out.append(TokenLogprob(token=token, logprob=comp.logprobs[i], bytes=list(token.encode("utf-8")),
                                top_logprobs=[TopLogprob(token=t, logprob=lp, bytes=list(t.encode("utf-8")))
                                              for t, lp in _top(state, alts, k, as_ids)]))
    return out


def completion_logprobs(state: ServerState, comp: CompletionOutput, k: int, as_ids: bool,
                        start: int = 0) -> CompletionLogprobs:
    """Legacy text-completion logprobs for tokens [start:]: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens = [state.token_str(t, as_ids) for t in comp.token_ids[start:]]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    tops = None
    if k:
        tops = [dict(_top(state, comp.top_logprobs[i] if comp.top_logprobs and i < len(comp.top_logprobs) else None,
                          k, as_ids)) for i in range(start, len(comp.token_ids))]
    return CompletionLogprobs(tokens=tokens, token_logprobs=list(comp.logprobs[start:]), top_logprobs=tops,
                              text_offset=offsets)


def prompt_logprobs(state: ServerState, out: RequestOutput, as_ids: bool) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM shape: None for the first prompt token, then {token_id: {logprob, rank, decoded_token}}."""
    lps = out.prompt_logprobs or []
    result: list[dict[str, dict[str, Any]] | None] = []
    for i, token in enumerate(out.prompt_token_ids):
        lp = lps[i] if i < len(lps) else None
        result.append(None if lp is None else
                      {str(token): {"logprob": lp, "rank": None, "decoded_token": state.token_str(token, as_ids)}})
    return result


def usage(out: RequestOutput) -> Usage:
    generated = sum(len(c.token_ids) for c in out.outputs)
    prompt = len(out.prompt_token_ids)
    return Usage(prompt_tokens=prompt, completion_tokens=generated, total_tokens=prompt + generated,
                 prompt_tokens_details={"cached_tokens": out.num_cached_tokens})
