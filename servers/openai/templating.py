"""Chat templating: the tokenizer's template (or a plain fallback) -> prompt token ids, HF semantics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mm_infer.engine.request import flat_token_ids  # reads every apply_chat_template / encode return shape
from servers.openai.errors import ApiError

RESERVED_KWARGS = {"messages", "add_generation_prompt", "continue_final_message", "tokenize", "tools"}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if p.get("type") == "text")


def fallback_render(messages: Sequence[Mapping[str, Any]], media_tokens: Mapping[str, str], eos: str,
                    add_generation_prompt: bool) -> str:
    """`role: content<eos>\\n` per message, media as their placeholder runs, then `assistant: `."""
    lines = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str):
            content = "".join(p.get("text", "") if p.get("type") == "text" else media_tokens[p["type"]]
                              for p in content or [])
        lines.append(f"{m['role']}: {content}{eos}\n")
    return "".join(lines) + ("assistant: " if add_generation_prompt else "")


class ChatRenderer:
    """Render messages with one tokenizer; `media_tokens` maps "image"/"video" to their placeholder text."""

    def __init__(self, tokenizer: Any, media_tokens: Mapping[str, str]) -> None:
        self.tokenizer = tokenizer
        self.media_tokens = dict(media_tokens)
        self.has_template = getattr(tokenizer, "chat_template", None) is not None
        eos = getattr(tokenizer, "special", {}).get("eos_token") if hasattr(tokenizer, "special") else None
        self.eos_text = eos or getattr(tokenizer, "eos_token", None) or ""

    def render_text(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                    continue_final_message: bool = False, chat_template_kwargs: Mapping[str, Any] | None = None,
                    tools: list[dict[str, Any]] | None = None) -> str:
        if continue_final_message and add_generation_prompt:
            raise ApiError(400, "continue_final_message and add_generation_prompt cannot both be true",
                           param="continue_final_message")
        if continue_final_message and (not messages or messages[-1].get("role") != "assistant"):
            raise ApiError(400, "continue_final_message needs the last message to be from the assistant",
                           param="continue_final_message")
        kwargs = dict(chat_template_kwargs or {})
        if bad := sorted(RESERVED_KWARGS & set(kwargs)):
            raise ApiError(400, f"chat_template_kwargs may not set {bad}", param="chat_template_kwargs")
        if self.has_template:
            if tools:
                kwargs["tools"] = tools
            try:
                text = self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                          add_generation_prompt=add_generation_prompt, **kwargs)
            except Exception as e:  # jinja raise_exception / template errors are the caller's input
                raise ApiError(400, f"chat template failed: {e}", param="messages") from None
            if isinstance(text, list):  # some tokenizers return a batch of one
                text = text[0]
        else:
            text = fallback_render(messages, self.media_tokens, self.eos_text, add_generation_prompt)
        if continue_final_message:
            final = _text_of(messages[-1].get("content"))
            at = text.rfind(final) if final else -1
            if at < 0:
                raise ApiError(400, "continue_final_message: the final message has no text to continue",
                               param="continue_final_message")
            text = text[:at + len(final)]
        return str(text)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return flat_token_ids(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def render(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> list[int]:
        """Token ids of the rendered conversation (media placeholders not yet expanded)."""
        return self.encode(self.render_text(messages, **options))
