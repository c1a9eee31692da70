"""POST /v1/responses: input items -> the chat pipeline (template, token splice, media) -> output items."""

from __future__ import annotations

import time
import uuid

from fastapi import Request

from servers.openai.chat import build_chat_prompt
from servers.openai.protocol import check_tool_choice, to_sampling_params
from servers.openai.responses_api.build import finish_response, response_head, to_chat_request
from servers.openai.responses_api.objects import ResponseObject
from servers.openai.responses_api.protocol import ResponsesRequest
from servers.openai.responses_api.stream import response_events
from servers.openai.state import ServerState
from servers.openai.streaming import ClosingStreamingResponse, Generation, watch
from servers.openai.vllm_fields import template_kwargs


async def create_response(state: ServerState, req: ResponsesRequest,
                          request: Request) -> ResponseObject | ClosingStreamingResponse:
    chat = to_chat_request(req)
    check_tool_choice(chat)
    params = to_sampling_params(chat, state.backend.vocab_size, state.sampling_defaults)
    prompt = await build_chat_prompt(
        state, chat.messages, add_generation_prompt=True, continue_final_message=False,
        chat_template_kwargs=template_kwargs(chat), mm_processor_kwargs=chat.mm_processor_kwargs,
        tools=chat.tools if chat.tool_choice != "none" else None, cache_salt=chat.cache_salt,
        media_io_kwargs=chat.media_io_kwargs)
    head = response_head(state, req, f"resp_{req.request_id or uuid.uuid4().hex}", int(time.time()))
    gen = Generation(state, prompt, params, head.id, None, req.stream)
    if req.stream:
        await watch(gen.start(), request.is_disconnected)
        return ClosingStreamingResponse(response_events(state, head, chat, gen.stream()),
                                        media_type="text/event-stream")
    out = await gen.final(request.is_disconnected)
    return finish_response(state, head, chat, out, weight_version=gen.weight_version)
