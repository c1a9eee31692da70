"""Routes of vLLM's RL surface: /server_info, /get_world_size, the weight-transfer rounds, sleep and wake."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Query

import mm_infer
from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.weight_transfer import FinishRequest, InitRequest, TransferReply, UpdateRequest
from servers.openai.config import ServerConfig
from servers.openai.control.sleep import SleepControl
from servers.openai.control.weight_transfer import TransferSession
from servers.openai.state import ServerState


def parse_version(raw: int | str | None) -> int | None:
    """finish_weight_update's weight_version: an integer (or its digits); anything else is a 400."""
    if raw is None or isinstance(raw, int):
        return raw
    if raw.strip().lstrip("-").isdigit():
        return int(raw)
    raise ApiError(400, f"weight_version must be an integer here, got {raw!r}", param="weight_version")


def server_info(state: ServerState, sleep: SleepControl) -> dict[str, Any]:
    """vLLM's /server_info keys that RL clients read, in its config_format=json shape, plus ours at the top."""
    cfg = state.config
    transfer = None if cfg.weight_transfer_backend is None else {"backend": cfg.weight_transfer_backend}
    facts = state.backend.facts
    world = facts.transfer_world_size
    return {"vllm_config": {"weight_transfer_config": transfer,
                            "model_config": {"model": cfg.model_dir, "max_model_len": facts.max_model_len},
                            "parallel_config": {"data_parallel_size": world, "world_size": 1,
                                                "tensor_parallel_size": tensor_parallel_size(cfg)},
                            "enable_sleep_mode": cfg.enable_sleep_mode},
            "weight_transfer_config": transfer, "world_size": world, "weight_version": state.backend.weight_version,
            "enable_sleep_mode": cfg.enable_sleep_mode, "is_sleeping": sleep.is_sleeping,
            "version": mm_infer.__version__}


def tensor_parallel_size(config: ServerConfig) -> int:
    """The ranks each engine splits the model over. Only rank 0 of an engine joins a weight-transfer group (it hands
    the other ranks their slices), so the transfer world stays one rank per engine."""
    return int(config.engine_options.get("tensor_parallel_size") or 1)


def add_rl_routes(app: FastAPI, state: ServerState, sleep: SleepControl) -> None:
    session = TransferSession(state.config.weight_transfer_backend, state.backend, state.gate, sleep)

    @app.get("/server_info")
    async def info(config_format: str = "json") -> dict[str, Any]:
        return server_info(state, sleep)

    @app.get("/get_world_size")
    async def get_world_size(include_dp: bool = True) -> dict[str, int]:
        """Engines that join a transfer group: one per replica (each is TP = PP = 1)."""
        return {"world_size": state.backend.facts.transfer_world_size if include_dp else 1}

    @app.post("/init_weight_transfer_engine")
    async def init_weight_transfer_engine(req: InitRequest) -> TransferReply:
        await session.init(req.init_info)
        return TransferReply(message="Weight transfer initialized", weight_version=state.backend.weight_version)

    @app.post("/start_weight_update")
    async def start_weight_update(body: dict[str, Any] | None = None) -> TransferReply:
        await session.start()  # vLLM's is_checkpoint_format: our refits always take checkpoint (HF) names
        return TransferReply(message="Weight update started", weight_version=state.backend.weight_version)

    @app.post("/update_weights")
    async def update_weights(req: UpdateRequest) -> TransferReply:
        count = await session.update(req.update_info)
        return TransferReply(message="Weights updated", weight_version=state.backend.weight_version,
                             num_tensors=count)

    @app.post("/finish_weight_update")
    async def finish_weight_update(req: FinishRequest | None = None) -> TransferReply:
        version, count = await session.finish(parse_version((req or FinishRequest()).weight_version))
        return TransferReply(message="Weight update finished", weight_version=version, num_tensors=count)

    @app.post("/sleep")
    async def sleep_route(level: int = 1, mode: str = "abort") -> dict[str, Any]:
        return await sleep.sleep(level, mode)

    @app.post("/wake_up")
    async def wake_up(tags: Annotated[list[str] | None, Query()] = None) -> dict[str, Any]:
        return await sleep.wake_up(tags or None)

    @app.get("/is_sleeping")
    async def is_sleeping() -> dict[str, bool]:
        return {"is_sleeping": sleep.is_sleeping}
