"""POST /abort_requests: end in-flight requests by id (as answered, or as the client named them) with a 503."""

from __future__ import annotations

import uuid

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from servers.openai.bodies.requests import Strict
from servers.openai.state import ServerState

# what each endpoint puts before the client's id ("chatcmpl-" + request_id or X-Request-Id, ...)
ID_PREFIXES = ("chatcmpl-", "cmpl-", "generate-tokens-", "resp_")


def id_names(request_id: str) -> set[str]:
    """The ids that name one engine request: itself, without its batch suffix ("cmpl-x-0": "cmpl-x"), and either
    of those without its endpoint prefix ("x")."""
    names = {request_id}
    head, sep, tail = request_id.rpartition("-")
    if sep and head and tail.isdigit():
        names.add(head)
    for name in list(names):
        for prefix in ID_PREFIXES:
            if name.startswith(prefix) and len(name) > len(prefix):
                names.add(name[len(prefix):])
    return names


def base_request_id(request: Request, body_id: str | None) -> str:
    """vLLM's rule: the X-Request-Id header, else the body's request_id, else a fresh one."""
    return request.headers.get("x-request-id") or body_id or uuid.uuid4().hex


class AbortRequest(Strict):
    request_ids: list[str] = Field(min_length=1)


class AbortResponse(BaseModel):
    aborted: list[str]  # the engine requests ended (their ids as answered)
    not_found: list[str]  # ids that named no request in flight (finished already, or never sent)


def add_abort_routes(app: FastAPI, state: ServerState) -> None:
    async def abort_requests(req: AbortRequest) -> AbortResponse:
        aborted: list[str] = []
        not_found: list[str] = []
        for name in dict.fromkeys(req.request_ids):
            hit = state.gate.abort_matching(lambda rid, n=name: n in id_names(rid),
                                            f"request {name!r} was aborted by POST /abort_requests")
            aborted += [rid for rid in hit if rid not in aborted]
            if not hit:
                not_found.append(name)
        return AbortResponse(aborted=aborted, not_found=not_found)

    app.post("/abort_requests")(abort_requests)
    app.post("/inference/v1/abort_requests")(abort_requests)  # vLLM's path under /inference
