"""Responses input items -> chat messages; each assistant turn keeps its own token ids and nobody else's.

Consecutive assistant-side items (reasoning, assistant message, function_call) form one assistant turn. The
turn takes the token ids of its item that carries them; that item closes the turn, so a later assistant item
starts a new turn that never inherits them. Any other item (user / system / developer message,
function_call_output) flushes the turn, and the ids are consumed with it. An assistant item with nothing
to say (no text, reasoning or call) is dropped, ids and all."""

from __future__ import annotations

from dataclasses import dataclass, field

from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.requests import ChatMessage, TextPart, ToolCall, ToolCallFunction
from servers.openai.endpoints.responses_api.protocol import (
    AssistantItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
    ReasoningItem,
    RefusalPart,
    TextItemPart,
    TokenFields,
)


def _item_text(item: MessageItem) -> str:
    if isinstance(item.content, str):
        return item.content
    out = []
    for part in item.content:
        if isinstance(part, TextItemPart):
            out.append(part.text)
        elif isinstance(part, RefusalPart):
            out.append(part.refusal)
        else:
            raise ApiError(400, "assistant messages hold text only (output_text / refusal parts)", param="input")
    return "".join(out)


def _reasoning_text(item: ReasoningItem) -> str:
    parts = item.content if item.content else item.summary
    return "".join(p.text for p in parts)


def _says_something(item: AssistantItem) -> bool:
    if isinstance(item, FunctionCallItem):
        return True
    if isinstance(item, ReasoningItem):
        return bool(_reasoning_text(item))
    return bool(_item_text(item))


def _ids(item: TokenFields, index: int) -> TokenFields | None:
    has_prompt, has_gen = item.prompt_token_ids is not None, item.generation_token_ids is not None
    if has_prompt != has_gen:
        raise ApiError(400, f"input[{index}]: give both prompt_token_ids and generation_token_ids, or neither",
                       param=f"input[{index}]")
    return item if has_prompt else None


@dataclass
class _Turn:
    """The assistant turn being collected."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    ids: TokenFields | None = None

    def add(self, item: AssistantItem) -> None:
        if isinstance(item, FunctionCallItem):
            self.calls.append(ToolCall(id=item.call_id, function=ToolCallFunction(name=item.name,
                                                                                  arguments=item.arguments)))
        elif isinstance(item, ReasoningItem):
            self.reasoning.append(_reasoning_text(item))
        else:
            self.text.append(_item_text(item))

    def message(self) -> ChatMessage | None:
        if not (self.text or self.reasoning or self.calls):
            return None
        ids = self.ids
        return ChatMessage(role="assistant", content="".join(self.text) or None,
                           reasoning_content="".join(self.reasoning) or None, tool_calls=self.calls or None,
                           prompt_token_ids=ids.prompt_token_ids if ids else None,
                           generation_token_ids=ids.generation_token_ids if ids else None)


def _user_side(item: MessageItem | FunctionCallOutputItem) -> ChatMessage:
    if isinstance(item, FunctionCallOutputItem):
        return ChatMessage(role="tool", tool_call_id=item.call_id, content=item.output)
    if isinstance(item.content, str):
        return ChatMessage(role=item.role, content=item.content)
    parts = []
    for part in item.content:
        if isinstance(part, TextItemPart):
            parts.append(TextPart(type="input_text", text=part.text))
        elif isinstance(part, RefusalPart):
            parts.append(TextPart(type="input_text", text=part.refusal))
        else:
            parts.append(part)
    return ChatMessage(role=item.role, content=parts)


def to_chat_messages(items: str | list[InputItem], instructions: str | None) -> list[ChatMessage]:
    """Chat messages for the template (instructions first, as a system message)."""
    out: list[ChatMessage] = [ChatMessage(role="system", content=instructions)] if instructions else []
    if isinstance(items, str):
        return [*out, ChatMessage(role="user", content=items)]
    turn = _Turn()

    def flush() -> None:
        nonlocal turn
        if (message := turn.message()) is not None:
            out.append(message)
        turn = _Turn()  # the turn's ids go with it: consumed, never carried further

    for i, item in enumerate(items):
        if isinstance(item, (ReasoningItem, FunctionCallItem)) or (isinstance(item, MessageItem)
                                                                   and item.role == "assistant"):
            ids = _ids(item, i)
            if not _says_something(item):
                continue  # dropped, and its ids with it
            if turn.ids is not None:
                flush()  # ids close their turn: what follows is a new turn
            turn.add(item)
            turn.ids = ids
        else:
            if isinstance(item, MessageItem) and (item.prompt_token_ids or item.generation_token_ids) is not None:
                raise ApiError(400, f"input[{i}]: token ids can only be carried on assistant items",
                               param=f"input[{i}]")
            flush()
            out.append(_user_side(item))
    flush()
    return out
