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
    URLRef,
    VideoURLPart,
)


@dataclass(frozen=True)
class MediaRef:
    """One media item as the request named it: a URL, a uuid of earlier media, or both."""

    kind: str  # "image" | "video" | "audio"
    url: str | None
    uuid: str | None
    where: str | None = None  # the part that named it ("messages[0].content[1]"), for errors


@dataclass
class ChatInput:
    messages: list[dict[str, Any]]
    media: list[MediaRef]
    carried: CarriedTurn | None


def _url_and_uuid(ref: URLRef | str | None, uuid: str | None) -> tuple[str | None, str | None]:
    if isinstance(ref, str) or ref is None:
        return ref, uuid
    return ref.url, uuid or ref.uuid


def _audio_url(part: InputAudioPart | AudioURLPart) -> tuple[str | None, str | None]:
    """An audio part's URL: input_audio's base64 data as a data URL of its format (wav when unnamed)."""
    if isinstance(part, AudioURLPart):
        return _url_and_uuid(part.audio_url, part.uuid)
    data = part.input_audio
    return (None if data is None else f"data:audio/{data.format or 'wav'};base64,{data.data}"), part.uuid


def _media_ref(part: Any, where: str) -> MediaRef:
    if isinstance(part, (ImageURLPart, VideoURLPart)):
        kind = "image" if isinstance(part, ImageURLPart) else "video"
        url, uuid = _url_and_uuid(part.image_url if isinstance(part, ImageURLPart) else part.video_url, part.uuid)
    elif isinstance(part, InputImagePart):
        kind, url, uuid = "image", part.image_url, part.uuid
    elif isinstance(part, InputVideoPart):
        kind, url, uuid = "video", part.video_url, part.uuid
    else:
        kind, (url, uuid) = "audio", _audio_url(part)
    if not url and not uuid:
        raise ApiError(400, f"{where}: a {kind} part needs a URL or the uuid of media sent earlier", param=where)
    return MediaRef(kind, url or None, uuid, where)


def _content(msg: ChatMessage, index: int, media: list[MediaRef], audio: str | None) -> str | list[dict[str, Any]]:
    if msg.content is None:
        return ""
    if isinstance(msg.content, str):
        return msg.content
    out: list[dict[str, Any]] = []
    for j, part in enumerate(msg.content):
        if isinstance(part, TextPart):
            out.append({"type": "text", "text": part.text})
        else:
            where = f"messages[{index}].content[{j}]"
            if isinstance(part, (InputAudioPart, AudioURLPart)) and audio is not None:
                raise ApiError(400, f"{where}: {part.type} parts are not supported: audio input is not served "
                                    f"for {audio}, which has no audio tower", param=where)
            ref = _media_ref(part, where)
            media.append(ref)
            out.append({"type": ref.kind})
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


def parse_messages(messages: list[ChatMessage], *, audio_refused_for: str | None = "this model") -> ChatInput:
    """Normalize parts for the chat template ({"type": "image"} etc.) and collect media in prompt order; audio
    parts are a 400 naming `audio_refused_for` (the model) unless it is None (a model with an audio tower)."""
    media: list[MediaRef] = []
    out: list[dict[str, Any]] = []
    carried: CarriedTurn | None = None
    for i, msg in enumerate(messages):
        d: dict[str, Any] = {"role": msg.role, "content": _content(msg, i, media, audio_refused_for)}
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
