"""Multi-turn token fidelity: splice the model's exact earlier tokens into a freshly templated prompt."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mm_infer.prompt.placeholders import PromptError


def _eos_id(tokenizer: Any) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    if eos is None:
        raise PromptError("cannot splice token ids: the tokenizer has no EOS token")
    return int(eos)


def _nth(ids: Sequence[int], token: int, n: int) -> int:
    """Index of the n-th (1-based) occurrence of token in ids, or -1."""
    seen = 0
    for i, t in enumerate(ids):
        if t == token:
            seen += 1
            if seen == n:
                return i
    return -1


def replace_prefix_tokens(tokenizer: Any, model_prefix_token_ids: Sequence[int],
                          template_prefix_token_ids: Sequence[int], template_token_ids: Sequence[int]) -> list[int]:
    """The model's exact tokens for the conversation so far, then the template's tokens for what follows.

    The template prefix (the conversation up to and including the last assistant turn) closes that turn
    with its N-th EOS. The full template is cut after its own N-th EOS; the model's tokens are kept up to
    and including their N-th EOS. A model prefix with N-1 EOS tokens (a turn cut by max_tokens or a stop
    string) is kept whole and closed with the template's EOS. Anything else cannot be spliced: PromptError.
    """
    model = [int(t) for t in model_prefix_token_ids]
    template = [int(t) for t in template_token_ids]
    if not model:
        return template
    eos = _eos_id(tokenizer)
    n = sum(1 for t in template_prefix_token_ids if t == eos)
    if n == 0:
        raise PromptError("cannot splice token ids: the templated conversation prefix has no EOS token")
    cut = _nth(template, eos, n)
    if cut < 0:
        raise PromptError(f"cannot splice token ids: the templated prompt has fewer than {n} EOS tokens")
    model_eos = sum(1 for t in model if t == eos)
    if model_eos >= n:
        return model[:_nth(model, eos, n) + 1] + template[cut + 1:]
    if model_eos == n - 1:
        return model + template[cut:]
    raise PromptError(f"cannot splice token ids: the previous turn's tokens hold {model_eos} EOS token(s) but the "
                      f"templated conversation closes {n} turn(s)")
