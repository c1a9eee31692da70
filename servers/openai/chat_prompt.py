"""Chat request -> engine prompt dict: template, carried-token splice and media, run concurrently."""

from __future__ import annotations

import asyncio
from typing import Any

from mm_infer.prompt import replace_prefix_tokens
from servers.openai.errors import ApiError
from servers.openai.messages import parse_messages
from servers.openai.protocol import ChatMessage, Tool
from servers.openai.state import ServerState


async def build_chat_prompt(state: ServerState, messages: list[ChatMessage], *, add_generation_prompt: bool,
                            continue_final_message: bool, chat_template_kwargs: dict[str, Any] | None,
                            mm_processor_kwargs: dict[str, Any] | None,
                            tools: list[Tool] | None) -> dict[str, Any]:
    """The engine prompt: token ids (earlier turns' exact ids spliced in) plus processed media."""
    chat = parse_messages(messages)
    opts = state.resolver.options(mm_processor_kwargs)
    tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
    render = state.renderer.render
    kwargs = {"chat_template_kwargs": chat_template_kwargs, "tools": tool_dicts}

    def template_ids() -> list[int]:
        ids = render(chat.messages, add_generation_prompt=add_generation_prompt,
                     continue_final_message=continue_final_message, **kwargs)
        if chat.carried is None:
            return ids
        if bad := [t for t in chat.carried.token_ids if not 0 <= t < state.vocab_size]:
            raise ApiError(400, f"carried token ids outside the vocabulary: {bad[:5]}", param="messages")
        prefix = render(chat.messages[:chat.carried.message_index + 1], add_generation_prompt=False, **kwargs)
        return replace_prefix_tokens(state.tokenizer, chat.carried.token_ids, prefix, ids)

    ids, (mm_data, mm_kwargs) = await asyncio.gather(asyncio.to_thread(template_ids),
                                                     state.resolver.resolve(chat.media, opts))
    prompt: dict[str, Any] = {"prompt_token_ids": ids}
    if mm_data:
        prompt["multi_modal_data"] = mm_data
    if mm_kwargs:
        prompt["mm_processor_kwargs"] = mm_kwargs
    return prompt
