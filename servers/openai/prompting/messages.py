"""Chat messages -> template-ready dicts, media references in prompt order, and carried token ids."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mm_infer.prompt.chat_prompt import CarriedTurn
from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.requests import (
    AudioURLPart,
    ChatMessage,
    ImageURLPart,
    InputAudioPart,
    InputImagePart,
    InputVideoPart,
    TextPart,
    VideoURLPart,
)


@dataclass(frozen=True)
class MediaRef:
    """One media item as the request named it: a URL, a uuid of earlier media, or both."""

    kind: str  # "image" | "video"
    url: str | None
    uuid: str | None


@dataclass
class ChatInput:
    messages: list[dict[str, Any]]
    media: list[MediaRef]
    carried: CarriedTurn | None


def _media_ref(part: Any, where: str) -> MediaRef:
    if isinstance(part, (ImageURLPart, VideoURLPart)):
        kind = "image" if isinstance(part, ImageURLPart) else "video"
        ref = part.image_url if isinstance(part, ImageURLPart) else part.video_url
        if isinstance(ref, str) or ref is None:
            url, uuid = ref, part.uuid
        else:
            url, uuid = ref.url, part.uuid or ref.uuid
    elif isinstance(part, InputImagePart):
        kind, url, uuid = "image", part.image_url, part.uuid
    else:
        kind, url, uuid = "video", part.video_url, part.uuid
    if not url and not uuid:
        raise ApiError(400, f"{where}: a {kind} part needs a URL or the uuid of media sent earlier", param=where)
    return MediaRef(kind, url or None, uuid)


def _content(msg: ChatMessage, index: int, media: list[MediaRef]) -> str | list[dict[str, Any]]:
    if msg.content is None:
        return ""
    if isinstance(msg.content, str):
        return msg.content
    out: list[dict[str, Any]] = []
    for j, part in enumerate(msg.content):
        if isinstance(part, TextPart):
            out.append({"type": "text", "text": part.text})
        elif isinstance(part, (ImageURLPart, VideoURLPart, InputImagePart, InputVideoPart)):
            ref = _media_ref(part, f"messages[{index}].content[{j}]")
            media.append(ref)
            out.append({"type": ref.kind})
        elif isinstance(part, (InputAudioPart, AudioURLPart)):
            where = f"messages[{index}].content[{j}]"
            raise ApiError(400, f"{where}: {part.type} parts are not supported: audio input is not served (models "
                                "without an audio tower cannot take it; Nemotron Omni's audio tower loads and is "
                                "exact, but prompts do not carry audio yet)", param=where)
    return out


def _tool_calls(msg: ChatMessage) -> list[dict[str, Any]]:
    calls = []
    for call in msg.tool_calls or []:
        try:
            arguments: Any = json.loads(call.function.arguments)
        except json.JSONDecodeError:
            arguments = call.function.arguments
        calls.append({"id": call.id, "type": "function",
                      "function": {"name": call.function.name, "arguments": arguments}})
    return calls


def _reasoning(msg: ChatMessage, index: int) -> str | None:
    """An earlier turn's reasoning, under vLLM's name (`reasoning`) or its deprecated alias."""
    if msg.reasoning is not None and msg.reasoning_content is not None and msg.reasoning != msg.reasoning_content:
        raise ApiError(400, f"messages[{index}]: reasoning and reasoning_content differ; send one",
                       param=f"messages[{index}].reasoning")
    return msg.reasoning if msg.reasoning is not None else msg.reasoning_content


def parse_messages(messages: list[ChatMessage]) -> ChatInput:
    """Normalize parts for the chat template ({"type": "image"} etc.) and collect media in prompt order."""
    media: list[MediaRef] = []
    out: list[dict[str, Any]] = []
    carried: CarriedTurn | None = None
    for i, msg in enumerate(messages):
        d: dict[str, Any] = {"role": msg.role, "content": _content(msg, i, media)}
        for key in ("name", "tool_call_id"):
            if getattr(msg, key) is not None:
                d[key] = getattr(msg, key)
        if (reasoning := _reasoning(msg, i)) is not None:  # templates read either name
            d["reasoning"] = d["reasoning_content"] = reasoning
        if msg.tool_calls:
            d["tool_calls"] = _tool_calls(msg)
        has_prompt, has_gen = msg.prompt_token_ids is not None, msg.generation_token_ids is not None
        if has_prompt != has_gen:
            raise ApiError(400, f"messages[{i}]: give both prompt_token_ids and generation_token_ids, or neither",
                           param=f"messages[{i}]")
        if has_prompt:
            if msg.role != "assistant":
                raise ApiError(400, f"messages[{i}]: token ids can only be carried on an assistant message",
                               param=f"messages[{i}]")
            carried = CarriedTurn(i, [*msg.prompt_token_ids, *msg.generation_token_ids])  # type: ignore[misc]
        out.append(d)
    return ChatInput(out, media, carried)
