"""POST /v1/responses: input items -> the chat pipeline (template, token splice, media) -> output items."""

from __future__ import annotations

import time
import uuid

from fastapi import Request

from servers.openai.answers.streaming import ClosingStreamingResponse, Generation, watch
from servers.openai.endpoints.chat import chat_request_prompt
from servers.openai.endpoints.responses_api.build import finish_response, response_head, to_chat_request
from servers.openai.endpoints.responses_api.objects import ResponseObject
from servers.openai.endpoints.responses_api.protocol import ResponsesRequest
from servers.openai.endpoints.responses_api.stream import response_events
from servers.openai.state import ServerState


async def create_response(state: ServerState, req: ResponsesRequest,
                          request: Request) -> ResponseObject | ClosingStreamingResponse:
    chat = to_chat_request(req)
    params, prompt = await chat_request_prompt(state, chat)  # chat's checks and caps, its template and media
    head = response_head(state, req, f"resp_{req.request_id or uuid.uuid4().hex}", int(time.time()))
    gen = Generation(state, prompt, params, head.id, None, req.stream)
    if req.stream:
        await watch(gen.start(), request.is_disconnected)
        return ClosingStreamingResponse(response_events(state, head, chat, gen),
                                        media_type="text/event-stream")
    out = await gen.final(request.is_disconnected)
    return finish_response(state, head, chat, out, weight_version=gen.weight_version)
