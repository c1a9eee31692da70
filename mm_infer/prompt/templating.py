"""The one chat-template renderer: messages -> prompt text / token ids with HF semantics, or a plain fallback."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mm_infer.prompt.content_format import text_parts_joined
from mm_infer.prompt.placeholders import PromptError
from mm_infer.prompt.tokenizer import Tokenizer

# keys the renderer sets itself; a caller's chat_template_kwargs may not override them
RESERVED_KWARGS = {"messages", "add_generation_prompt", "continue_final_message", "tokenize", "tools"}


def flat_token_ids(obj: Any) -> list[int]:
    """Token ids from any apply_chat_template/tokenizer return shape: list, nested list, dict, tensor."""
    if isinstance(obj, Mapping) or hasattr(obj, "keys"):
        if "input_ids" not in obj:
            raise PromptError(f"tokenizer output has no input_ids (keys: {list(obj.keys())})")
        obj = obj["input_ids"]
    if hasattr(obj, "tolist"):
        obj = obj.tolist()
    if isinstance(obj, (list, tuple)) and obj and isinstance(obj[0], (list, tuple)):
        if len(obj) != 1:
            raise PromptError(f"expected one tokenized conversation, got a batch of {len(obj)}")
        obj = obj[0]
    if not isinstance(obj, (list, tuple)) or not all(isinstance(t, int) for t in obj):
        raise PromptError(f"could not read token ids from tokenizer output of type {type(obj).__name__}")
    return [int(t) for t in obj]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if p.get("type") == "text")


def developer_as_system(messages: Sequence[Mapping[str, Any]], template: Any) -> list[Mapping[str, Any]]:
    """OpenAI's `developer` role as `system` unless the template names it (vLLM's rule: most templates, every
    Qwen-VL one, know no developer and would print the role literally after their default system prompt)."""
    if not any(m.get("role") == "developer" for m in messages):
        return list(messages)
    sources = template.values() if isinstance(template, Mapping) else [template]
    if any(isinstance(t, str) and "developer" in t for t in sources):
        return list(messages)
    return [{**m, "role": "system"} if m.get("role") == "developer" else m for m in messages]


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


def _check_options(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool,
                   continue_final_message: bool, kwargs: Mapping[str, Any]) -> None:
    if continue_final_message and add_generation_prompt:
        raise PromptError("continue_final_message and add_generation_prompt cannot both be true",
                          param="continue_final_message")
    if continue_final_message and (not messages or messages[-1].get("role") != "assistant"):
        raise PromptError("continue_final_message needs the last message to be from the assistant",
                          param="continue_final_message")
    if bad := sorted(RESERVED_KWARGS & set(kwargs)):
        raise PromptError(f"chat_template_kwargs may not set {bad}", param="chat_template_kwargs")


class ChatRenderer:
    """Render messages with one tokenizer; `media_tokens` maps "image"/"video" to their placeholder text."""

    def __init__(self, tokenizer: Any, media_tokens: Mapping[str, str]) -> None:
        self.tokenizer = tokenizer
        self.media_tokens = dict(media_tokens)
        self.has_template = getattr(tokenizer, "chat_template", None) is not None
        eos = getattr(tokenizer, "special", {}).get("eos_token") if hasattr(tokenizer, "special") else None
        self.eos_text = eos or getattr(tokenizer, "eos_token", None) or ""

    def template_context(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                         continue_final_message: bool = False, chat_template_kwargs: Mapping[str, Any] | None = None,
                         tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """What a jinja template renders with besides `messages` (the options checked): add_generation_prompt, the
        tokenizer's special tokens, tools and the caller's kwargs. What a template worker is sent."""
        kwargs = dict(chat_template_kwargs or {})
        _check_options(messages, add_generation_prompt, continue_final_message, kwargs)
        kwargs.pop("chat_template", None)
        if tools:
            kwargs["tools"] = tools
        return {**self.special_tokens(), **kwargs, "add_generation_prompt": add_generation_prompt}

    def tokenizer_template(self) -> Any:
        return getattr(self.tokenizer, "chat_template", None)

    def special_tokens(self) -> dict[str, str | None]:
        special = getattr(self.tokenizer, "special", None)
        if isinstance(special, Mapping):
            return dict(special)
        return {k: getattr(self.tokenizer, k, None) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}

    def render_text(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                    continue_final_message: bool = False, chat_template_kwargs: Mapping[str, Any] | None = None,
                    tools: list[dict[str, Any]] | None = None, chat_template: str | None = None,
                    max_chars: int | None = None) -> str:
        """`chat_template` (jinja text) renders instead of the checkpoint's template, in this process (a template
        a request sent goes to template_workers instead); past `max_chars` characters it fails (PromptError)."""
        kwargs = dict(chat_template_kwargs or {})
        _check_options(messages, add_generation_prompt, continue_final_message, kwargs)
        if chat_template is not None:
            kwargs["chat_template"] = chat_template
        template = kwargs.get("chat_template") or self.tokenizer_template()
        messages = text_parts_joined(developer_as_system(messages, template), template, self.media_tokens)
        if self.has_template or kwargs.get("chat_template") is not None:
            if tools:
                kwargs["tools"] = tools
            if max_chars is not None and isinstance(self.tokenizer, Tokenizer):
                kwargs["max_chars"] = max_chars
            try:
                text = self.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                          add_generation_prompt=add_generation_prompt, **kwargs)
            except Exception as e:  # jinja raise_exception / template errors are the caller's input
                raise PromptError(f"chat template failed: {e}",
                                  param="messages" if chat_template is None else "chat_template") from None
            if isinstance(text, list):  # some tokenizers return a batch of one
                text = text[0]
        elif not self.media_tokens:
            raise PromptError("this checkpoint has no chat template; send a prompt or token ids", param="messages")
        else:
            text = fallback_render(messages, self.media_tokens, self.eos_text, add_generation_prompt)
        return self.finish_text(str(text), messages, continue_final_message)

    @staticmethod
    def finish_text(text: str, messages: Sequence[Mapping[str, Any]], continue_final_message: bool) -> str:
        """The rendered text as the answer continues it: cut after the final message's text under
        continue_final_message (the template closed the turn)."""
        if continue_final_message:
            final = _text_of(messages[-1].get("content"))
            at = text.rfind(final) if final else -1
            if at < 0:
                raise PromptError("continue_final_message: the final message has no text to continue",
                                  param="continue_final_message")
            text = text[:at + len(final)]
        return text

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return flat_token_ids(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def render(self, messages: Sequence[Mapping[str, Any]], add_special_tokens: bool = False,
               **options: Any) -> list[int]:
        """Token ids of the rendered conversation (media placeholders not yet expanded); `add_special_tokens`
        adds the tokenizer's own (BOS, ...) on top of what the template writes."""
        return self.encode(self.render_text(messages, **options), add_special_tokens)


def media_token_text(tokenizer: Any, ids: Any) -> dict[str, str]:
    """The text of one unexpanded placeholder run per modality (for the fallback template)."""
    decode = tokenizer.decode
    return {kind: decode([ids.vision_start_id, pad, ids.vision_end_id], skip_special_tokens=False)
            for kind, pad in (("image", ids.image_pad_id), ("video", ids.video_pad_id))}
