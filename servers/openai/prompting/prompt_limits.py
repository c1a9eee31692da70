"""Per-prompt limits vLLM applies before generation: media items per prompt, and truncate_prompt_tokens's length
(the truncation itself is the library's: mm_infer/prompt/chat_prompt.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from servers.openai.bodies.errors import ApiError


def check_media_counts(kinds: Iterable[str], limits: dict[str, int] | None) -> None:
    """More images (or videos) in one prompt than --limit-mm-per-prompt allows is a 400 naming both."""
    if not limits:
        return
    for kind, count in Counter(kinds).items():
        limit = limits.get(kind)
        if limit is not None and count > limit:
            raise ApiError(400, f"at most {limit} {kind}(s) may be provided in one prompt (limit_mm_per_prompt); "
                           f"this one has {count}", param="messages")


def truncation_length(k: int | None, max_model_len: int) -> int | None:
    """How many prompt tokens to keep: None (all), k, or max_model_len for k = -1 (vLLM's)."""
    return max_model_len if k == -1 else k
