"""Per-token stop rules (vLLM's): EOS, stop token ids, stop strings ending after min_tokens, length."""

from __future__ import annotations

from collections.abc import Collection

from mm_infer.engine.scheduling.sequence import Sequence

Stop = tuple[str, int | str | None]  # (finish_reason, stop_reason)


def _find_stop_string(seq: Sequence, new_chars: int) -> tuple[int, str] | None:
    """vLLM's check_stop_strings: (character offset, stop string) of the first stop string, in the request's order,
    that ends in the last `new_chars` committed characters (it may begin before them)."""
    if not new_chars:
        return None
    text, stops = seq.detok.committed, seq.params.stop_list
    base = max(text.length - new_chars - max(len(s) for s in stops) + 1, 0)
    window = text.since(base)
    for stop in stops:
        at = window.find(stop, max(len(window) - new_chars - len(stop) + 1, 0))
        if at != -1:
            return base + at, stop
    return None


def _token_stop(token: int, seq: Sequence, eos_ids: Collection[int]) -> Stop | None:
    """vLLM: the primary EOS (the first of an ordered eos_ids) ends with stop_reason None; the generation config's
    other EOS ids are stop token ids (under ignore_eos, neither stops); a stop token id is its own stop_reason.
    An unordered set of eos ids names no primary: each of them ends as the EOS."""
    p = seq.params
    if token in eos_ids and not p.ignore_eos:
        primary = eos_ids[0] if isinstance(eos_ids, tuple) else token
        return "stop", None if token == primary else token
    if token in (p.stop_token_ids or ()):
        return "stop", token
    return None


def apply_stop_rules(seq: Sequence, token: int, eos_ids: Collection[int], max_new_tokens: int) -> Stop | None:
    """(finish_reason, stop_reason) after `token` was appended to seq (and its text pushed), else None; a stop
    string that ends the sample also fixes its final text (seq.final_text, cut per include_stop_str_in_output).

    eos_ids: the model's EOS ids, primary first when a tuple. Stop tokens count from min_tokens on; stop strings
    only once more than min_tokens tokens are out, and only where they end in text after the min_tokens-th token."""
    p = seq.params
    produced = seq.num_output_tokens
    if produced >= p.min_tokens and (stop := _token_stop(token, seq, eos_ids)) is not None:
        return stop
    if p.stop_list and produced > p.min_tokens and (hit := _find_stop_string(seq, seq.last_text_chars)) is not None:
        at, stop_str = hit
        text = seq.detok.committed.value()
        seq.final_text = text[:at + len(stop_str)] if p.include_stop_str_in_output else text[:at]
        return "stop", stop_str
    if produced >= max_new_tokens:
        return "length", None
    return None
