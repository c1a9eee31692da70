"""FastAPI app: /v1/chat/completions over HFModel, with mm-infer's RL token fields unless told to act plain."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from mm_infer.media import MediaError
from mm_infer.prompt.placeholders import PromptError
from servers.hf_reference.model import Generated, GenParams, HFModel
from servers.hf_reference.prompt import PARTS, BadRequest, PromptBuilder

KNOWN = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "n",
         "logprobs", "top_logprobs", "return_token_ids", "stream", "user"}


@dataclass(frozen=True)
class Options:
    """What this reference server leaves out, to stand in for servers without mm-infer's extensions."""

    token_ids: bool = True  # prompt_token_ids / token_ids / message-level ids
    logprobs: bool = True  # logprobs.content
    max_videos: int | None = None  # like vLLM's --limit-mm-per-prompt '{"video": N}'; 0 refuses video


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                   "code": str(status)}}, status_code=status)


def _params(body: dict[str, Any]) -> GenParams:
    if unknown := sorted(set(body) - KNOWN):
        raise BadRequest(f"unsupported fields: {', '.join(unknown)}")
    if body.get("n", 1) != 1 or body.get("stream"):
        raise BadRequest("the HF reference answers n=1, non-streaming requests only")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
    temperature = body.get("temperature")
    return GenParams(int(max_tokens), 1.0 if temperature is None else float(temperature),
                     float(body.get("top_p") or 1.0), int(body.get("top_k") or 0), body.get("seed"),
                     int(body.get("top_logprobs") or 0))


class Reference:
    """Tokenizer, prompt builder and model for one checkpoint."""

    def __init__(self, model_dir: str | Path, options: Options) -> None:
        from transformers import AutoTokenizer

        self.name = Path(model_dir).name
        self.options = options
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = HFModel(model_dir)
        self.builder = PromptBuilder(model_dir, self.tokenizer, self.model.config)
        self.lock = threading.Lock()

    def token_str(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _logprobs(self, gen: Generated) -> dict[str, Any]:
        def entry(token_id: int, lp: float) -> dict[str, Any]:
            s = self.token_str(token_id)
            return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}
        return {"content": [entry(t, lp) | {"top_logprobs": [entry(a, alp) for a, alp in
                                                             (gen.top_logprobs[i] if gen.top_logprobs else [])]}
                            for i, (t, lp) in enumerate(zip(gen.token_ids, gen.logprobs, strict=True))]}

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        params = _params(body)
        messages = body.get("messages") or []
        videos = sum(PARTS.get(p.get("type")) == "video" for m in messages if isinstance(m.get("content"), list)
                     for p in m["content"])
        if self.options.max_videos is not None and videos > self.options.max_videos:
            raise BadRequest(f"{videos} video(s) in the prompt; this server accepts at most {self.options.max_videos}")
        prompt = self.builder.build(messages)
        with self.lock:
            gen = self.model.generate(prompt, params)
        ids_on = self.options.token_ids
        message: dict[str, Any] = {"role": "assistant",
                                   "content": self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)}
        if ids_on:
            message |= {"prompt_token_ids": prompt.token_ids, "generation_token_ids": gen.token_ids,
                        "generation_log_probs": gen.logprobs}
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": gen.finish_reason,
                                  "logprobs": self._logprobs(gen) if body.get("logprobs") and self.options.logprobs
                                  else None}
        want_ids = ids_on and bool(body.get("return_token_ids"))
        if want_ids:
            choice["token_ids"] = gen.token_ids
        n_prompt, n_gen = len(prompt.token_ids), len(gen.token_ids)
        out = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
               "model": self.name, "choices": [choice],
               "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen}}
        if want_ids:
            out["prompt_token_ids"] = prompt.token_ids
        return out


def build_app(ref: Reference) -> FastAPI:
    app = FastAPI(title="mm-infer HF reference")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": ref.name, "object": "model", "owned_by": "hf-reference"}]}

    @app.post("/reset_prefix_cache")
    def reset_prefix_cache() -> dict[str, bool]:
        return {"success": True}  # nothing is cached: every request is computed from scratch

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        try:
            import anyio.to_thread

            return JSONResponse(await anyio.to_thread.run_sync(ref.chat, body))
        except (BadRequest, PromptError, MediaError, KeyError, TypeError, ValueError) as exc:
            status = getattr(exc, "status", 400) if isinstance(exc, MediaError) else 400
            return _error(int(status), f"{type(exc).__name__}: {exc}")

    return app
