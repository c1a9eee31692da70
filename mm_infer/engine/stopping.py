"""Per-token stop rules: EOS, stop token ids, stop strings (searched on a bounded tail of the text), length."""

from __future__ import annotations

from mm_infer.engine.sequence import Sequence

Stop = tuple[str, int | str | None]  # (finish_reason, stop_reason)


def _find_stop_string(seq: Sequence, new_chars: int) -> tuple[int, str] | None:
    """(character offset, stop string) of the earliest stop string that ends in the last `new_chars` characters
    (all of them on the first check), in committed + pending text."""
    text = seq.detok.committed
    stops = seq.params.stop_list
    if seq.stop_checked:
        tail_from = max(text.length - new_chars - (max(len(s) for s in stops) - 1), 0)
    else:  # the first check after min_tokens sees everything generated before it too
        tail_from, seq.stop_checked = 0, True
    window = text.since(tail_from) + seq.detok.pending
    hits = [(window.find(s), s) for s in stops if s in window]
    if not hits:
        return None
    at, stop = min(hits)
    return tail_from + at, stop


def check_stop(seq: Sequence, token: int, eos_ids: frozenset[int], max_new_tokens: int) -> Stop | None:
    """(finish_reason, stop_reason) after `token` was appended to seq (and its text pushed), else None."""
    p = seq.params
    produced = seq.num_output_tokens
    if produced >= p.min_tokens:
        if token in eos_ids and not p.ignore_eos:
            return "stop", None
        if token in (p.stop_token_ids or ()):
            return "stop", token
        if p.stop_list and (hit := _find_stop_string(seq, seq.last_text_chars)) is not None:
            at, stop = hit
            text = seq.detok.committed.value() + seq.detok.pending
            seq.final_text = text[:at + len(stop)] if p.include_stop_str_in_output else text[:at]
            return "stop", stop
    if produced >= max_new_tokens:
        return "length", None
    return None
