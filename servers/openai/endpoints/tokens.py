"""POST /tokenize (expanded ids and placeholder ranges, for text or messages) and POST /detokenize."""

from __future__ import annotations

import asyncio
from typing import Any

from mm_infer.prompt.inputs import PromptInput
from servers.openai.bodies.errors import ApiError, from_exception
from servers.openai.bodies.replies import DetokenizeResponse, PlaceholderOut, TokenizeResponse
from servers.openai.bodies.requests import DetokenizeRequest, TokenizeRequest
from servers.openai.endpoints.chat import build_chat_prompt
from servers.openai.prompting.admission import check_text
from servers.openai.state import ServerState


async def tokenize(state: ServerState, req: TokenizeRequest) -> TokenizeResponse:
    if req.prompt is None and req.messages is None:  # vLLM's request model: neither is a validation error
        raise ApiError(400, "give one of prompt or messages", param="body.prompt", type="Bad Request")
    if req.prompt is not None and req.messages is not None:
        raise ApiError(400, "give exactly one of prompt or messages", param="prompt")
    if req.messages is not None:
        prompt = await build_chat_prompt(
            state, req.messages, add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message, chat_template_kwargs=req.chat_template_kwargs,
            mm_processor_kwargs=req.mm_processor_kwargs, tools=req.tools, chat_template=req.chat_template,
            media_io_kwargs=req.media_io_kwargs)
    else:
        text = req.prompt or ""
        check_text(state.preparer.tokenizer, state.backend.facts.max_model_len, [text], "prompt")
        ids = await asyncio.to_thread(state.preparer.renderer.encode, text, req.add_special_tokens)
        if not ids:  # vLLM counts an empty prompt as 0 tokens (generation would refuse it)
            return _response(state, req, [])
        prompt = PromptInput(token_ids=ids)
    try:
        prepared = await asyncio.to_thread(state.preparer.prepare, prompt)
    except Exception as exc:
        raise from_exception(exc) from exc
    return _response(state, req, list(prepared.prompt_token_ids),
                     [PlaceholderOut(modality=r.modality, offset=r.offset, length=r.length,
                                     frame_indices=_frames(prepared.items[r.item_index].frame_indices))
                      for r in prepared.placeholders])


def _response(state: ServerState, req: TokenizeRequest, ids: list[int],
              placeholders: list[PlaceholderOut] | None = None) -> TokenizeResponse:
    pieces = token_pieces(state.preparer.tokenizer, ids) if req.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=state.backend.facts.max_model_len, tokens=ids,
                            token_strs=pieces, placeholders=placeholders or [])


def token_pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each id's vocabulary piece ('Ġa', 'Ċ'), as vLLM's convert_ids_to_tokens gives them, not its decoded text."""
    if hasattr(tokenizer, "convert_ids_to_tokens"):  # an HF tokenizer
        return [str(p) for p in tokenizer.convert_ids_to_tokens(ids)]
    backend = tokenizer.backend  # mm_infer's Tokenizer: the `tokenizers` model
    return [backend.id_to_token(t) or "" for t in ids]


def _frames(indices: tuple[int, ...] | None) -> list[int] | None:
    return None if indices is None else list(indices)


def detokenize(state: ServerState, req: DetokenizeRequest) -> DetokenizeResponse:
    if bad := [t for t in req.tokens if not 0 <= t < state.backend.facts.vocab_size]:
        raise ApiError(400, f"token ids outside the vocabulary: {bad[:5]}", param="tokens")
    return DetokenizeResponse(prompt=state.preparer.tokenizer.decode(req.tokens, skip_special_tokens=False))
