"""RL control routes: pause / resume, weight refits from disk, cache reset, and the weight version."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI

from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.replies import PauseStatus, UpdateWeightsResponse, WeightVersion
from servers.openai.bodies.requests import PAUSE_MODES, PauseMode, PauseRequest, UpdateWeightsFromDiskRequest
from servers.openai.control.refit import Refitter
from servers.openai.control.sleep import SleepControl
from servers.openai.endpoints.rl_routes import add_rl_routes
from servers.openai.state import ServerState


def pause_mode(query: str | None, body: PauseRequest | None) -> PauseMode:
    if query is not None and query not in PAUSE_MODES:
        raise ApiError(400, f"mode {query!r} is not one of {list(PAUSE_MODES)}", param="mode")
    if query is not None and body is not None and "mode" in body.model_fields_set and body.mode != query:
        raise ApiError(400, f"mode is {query!r} in the query string but {body.mode!r} in the body", param="mode")
    return query if query is not None else (body or PauseRequest()).mode  # type: ignore[return-value]


def add_admin_routes(app: FastAPI, state: ServerState) -> None:
    gate = state.gate
    default_roots = (Path(state.config.model_dir).resolve().parent,)
    refitter = Refitter(state.backend, gate, state.config.allowed_weights_paths or default_roots)
    sleep = SleepControl(state.config.enable_sleep_mode, state.backend, gate)
    add_rl_routes(app, state, sleep)

    @app.post("/pause")
    async def pause(req: PauseRequest | None = None, mode: str | None = None) -> PauseStatus:
        """The mode from the query string (vLLM: POST /pause?mode=keep) or the body; both must agree."""
        mode = pause_mode(mode, req)
        count = await gate.pause(mode)
        return PauseStatus(is_paused=True, mode=mode, num_paused_requests=count)

    @app.post("/resume")
    async def resume() -> PauseStatus:
        await gate.resume()
        return PauseStatus(is_paused=False)

    @app.get("/is_paused")
    async def is_paused() -> PauseStatus:
        return PauseStatus(is_paused=gate.paused, mode=gate.mode)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(req: UpdateWeightsFromDiskRequest) -> UpdateWeightsResponse:
        sleep.check_refit()
        done = await refitter.from_disk(req.model_path, req.weight_version, req.bucket_bytes,
                                        req.abort_all_requests, req.allow_nonfinite)
        await sleep.after_refit()
        return UpdateWeightsResponse(message=f"loaded {done.num_tensors} tensors from {req.model_path}",
                                     weight_version=done.weight_version, num_tensors=done.num_tensors,
                                     num_buckets=done.num_buckets, num_paused_requests=done.num_paused_requests)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> dict[str, bool]:
        await refitter.reset_caches()
        return {"success": True}

    @app.get("/weight_version")
    async def weight_version() -> WeightVersion:
        return WeightVersion(weight_version=state.backend.weight_version)
