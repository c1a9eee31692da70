"""A chat prompt, typed, and the one way it becomes token ids: render the template, splice an earlier turn's exact
ids back in, then truncate from the front without ever cutting a media run. The server, multi-turn rollouts and
the offline API all go through here."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mm_infer.prompt.inputs import PromptInput
from mm_infer.prompt.placeholders import PlaceholderIds, PromptError, find_pad_runs
from mm_infer.prompt.retokenize import replace_prefix_tokens
from mm_infer.prompt.templating import ChatRenderer


@dataclass(frozen=True)
class TemplateOptions:
    """How the conversation is rendered (vLLM's chat request fields of the same names)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: Mapping[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None

    def as_kwargs(self) -> dict[str, Any]:
        return {"add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message,
                "chat_template_kwargs": self.chat_template_kwargs, "tools": self.tools}


@dataclass(frozen=True)
class CarriedTurn:
    """The last assistant turn whose exact token ids the caller kept (its prompt ids + generated ids)."""

    message_index: int
    token_ids: list[int]


@dataclass
class ChatPrompt:
    """Template-ready messages (media parts as {"type": "image"} / {"type": "video"}, in prompt order) and how to
    turn them into ids."""

    messages: list[dict[str, Any]]
    options: TemplateOptions = field(default_factory=TemplateOptions)
    carried: CarriedTurn | None = None
    add_special_tokens: bool = False  # the tokenizer's own (BOS, ...) on top of what the template writes


# (messages, options) -> the rendered text; the default renders the checkpoint's template in this process
RenderText = Callable[[Sequence[Mapping[str, Any]], TemplateOptions], str]


def render_jobs(chat: ChatPrompt) -> list[tuple[list[dict[str, Any]], TemplateOptions]]:
    """What to render, in order: the conversation, then (with a carried turn) the conversation up to and including
    that turn, closed (no generation prompt). A caller that renders elsewhere (a template sandbox) renders these."""
    jobs = [(chat.messages, chat.options)]
    if chat.carried is not None:
        closed = replace(chat.options, add_generation_prompt=False, continue_final_message=False)
        jobs.append((chat.messages[:chat.carried.message_index + 1], closed))
    return jobs


def ids_from_rendered(chat: ChatPrompt, renderer: ChatRenderer, texts: Sequence[str]) -> list[int]:
    """The prompt's ids from the texts of `render_jobs` (media placeholders not yet expanded). With a carried
    turn, the rendered conversation up to that turn is replaced by its exact ids (multi-turn token fidelity)."""
    ids = renderer.encode(texts[0], chat.add_special_tokens)
    if chat.carried is None:
        return ids
    prefix = renderer.encode(texts[1], chat.add_special_tokens)
    return replace_prefix_tokens(renderer.tokenizer, chat.carried.token_ids, prefix, ids)


def chat_token_ids(chat: ChatPrompt, renderer: ChatRenderer, render: RenderText | None = None) -> list[int]:
    """Render (by default the checkpoint's template, in this process) and splice: the prompt's ids."""
    def own(messages: Sequence[Mapping[str, Any]], options: TemplateOptions) -> str:
        return renderer.render_text(messages, **options.as_kwargs())

    render = render or own
    return ids_from_rendered(chat, renderer, [render(messages, options) for messages, options in render_jobs(chat)])


def truncate_ids(ids: Sequence[int], keep: int | None) -> list[int]:
    """The last `keep` ids (a text or token-id prompt, no media)."""
    return list(ids) if keep is None or len(ids) <= keep else list(ids[len(ids) - keep:])


def truncate_prompt(prompt: PromptInput, keep: int | None, ids: PlaceholderIds, merge: int) -> PromptInput:
    """Keep the last `keep` tokens of the expanded prompt; a PromptError if that would cut into (or drop) a media
    run (its <|vision_start|> included)."""
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
        raise PromptError(f"truncate_prompt_tokens={keep} would cut the {runs[0].modality} placeholder run at "
                          f"token {runs[0].start}: keep at least {expanded - runs[0].start + 1} tokens",
                          param="truncate_prompt_tokens")
    return replace(prompt, token_ids=tokens[cut:])
