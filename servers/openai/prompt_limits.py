"""Per-prompt limits vLLM applies before generation: media items per prompt, and truncate_prompt_tokens."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

from mm_infer.prompt.inputs import PromptInput
from mm_infer.prompt.placeholders import PlaceholderIds, find_pad_runs
from servers.openai.errors import ApiError


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


def truncate_ids(ids: Sequence[int], keep: int | None) -> list[int]:
    """The last `keep` ids (a text or token-id prompt, no media)."""
    return list(ids) if keep is None or len(ids) <= keep else list(ids[len(ids) - keep:])


def truncate_prompt(prompt: PromptInput, keep: int | None, ids: PlaceholderIds, merge: int) -> PromptInput:
    """Keep the last `keep` tokens of the expanded prompt; a 400 if that would cut into (or drop) a media run."""
    tokens = list(prompt.token_ids or [])
    if keep is None:
        return prompt
    runs = find_pad_runs(tokens, ids)
    items = {"image": list(prompt.images), "video": list(prompt.videos)}
    seen = {"image": 0, "video": 0}
    expanded = len(tokens)
    for run in runs:
        k = seen[run.modality]
        seen[run.modality] += 1
        if k < len(items[run.modality]):
            expanded += items[run.modality][k].num_tokens(merge) - run.length
    cut = expanded - keep  # tokens to drop from the front; before the first run, both numberings agree
    if cut <= 0:
        return prompt
    if runs and cut > runs[0].start - 1:  # the run's <|vision_start|> sits just before it
        raise ApiError(400, f"truncate_prompt_tokens={keep} would cut the {runs[0].modality} placeholder run at "
                       f"token {runs[0].start}: keep at least {expanded - runs[0].start + 1} tokens",
                       param="truncate_prompt_tokens")
    return replace(prompt, token_ids=tokens[cut:])
