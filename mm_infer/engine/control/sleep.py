"""Sleep and wake (vLLM's levels): free the KV pool and encoder cache, offload (1) or discard (2) the weights."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch

from mm_infer.engine.control.sleep_state import EngineAsleepError, SleepState
from mm_infer.models import packed_weights

TAGS = ("weights", "kv_cache")


class Sleeper(Protocol):
    """What sleep and wake use of an LLMEngine (named here, not imported: the engine's sleep methods call these)."""

    sleep_state: SleepState
    sleep_kv_shape: Any
    model: torch.nn.Module
    runner: Any
    block_manager: Any
    encoder_cache: Any
    num_waiting: int
    num_running: int

    @property
    def device(self) -> torch.device: ...

    def has_unfinished(self) -> bool: ...


def sleep(engine: Sleeper, level: int) -> SleepState:
    """Level 0: nothing released; 1: KV pool and encoder cache freed, weights to host; 2: weights discarded too.
    Needs an idle engine (pause first)."""
    state = engine.sleep_state
    if level not in (0, 1, 2):
        raise ValueError(f"sleep level must be 0, 1 or 2, got {level}")
    if engine.has_unfinished():
        raise EngineAsleepError(f"{engine.num_waiting + engine.num_running} requests are still in the engine; "
                                "pause (mode abort or wait) before sleeping")
    state.level = max(state.level, level)
    if level >= 1 and not state.kv_freed:
        _release_kv(engine)
        state.kv_freed = True
    if level == 2 and state.weights != "discarded":
        state.shapes = _discard_weights(engine.model)
        state.weights = "discarded"
    elif level == 1 and state.weights == "loaded":
        _move_weights(engine.model, torch.device("cpu"))
        state.weights = "offloaded"
    return state


def wake_up(engine: Sleeper, tags: Iterable[str] | None = None) -> SleepState:
    """Bring back what `tags` names (both by default): weights (offloaded: their values; discarded: memory, to be
    refit) and the KV pool (empty: every prefix-cache entry is gone)."""
    state = engine.sleep_state
    wanted = set(TAGS if tags is None else tags)
    if unknown := wanted - set(TAGS):
        raise ValueError(f"unknown wake_up tags {sorted(unknown)}: use {list(TAGS)}")
    device = engine.device
    if "weights" in wanted and state.weights == "offloaded":
        _move_weights(engine.model, device)
        state.weights = "loaded"
    elif "weights" in wanted and state.weights == "discarded":
        _allocate_weights(engine.model, state.shapes, device)
        state.weights, state.shapes, state.reloaded = "unloaded", {}, set()
    if "kv_cache" in wanted and state.kv_freed:
        _restore_kv(engine)
        state.kv_freed = False
    if not state.is_sleeping:
        state.level = 0
    return state


def _release_kv(engine: Sleeper) -> None:
    """Drop the KV tensors (the KVCache object stays: static decode holds it), captured graphs and the caches."""
    kv = engine.runner.kv
    engine.sleep_kv_shape = (tuple(kv.k.shape), kv.k.dtype)
    kv.k = kv.v = torch.empty(0, dtype=kv.k.dtype, device=kv.k.device)
    graphs = engine.runner.graphs
    if graphs is not None:  # captured graphs point at the old KV and weights
        graphs.graphs.clear()
        graphs.pool = None
    engine.encoder_cache.clear()
    engine.block_manager.reset_prefix_cache()  # state snapshots go with the prefix cache
    if engine.runner.states is not None:  # hybrid models: an idle engine's live states hold nothing either
        engine.runner.states.release()
    _empty_device_cache(engine.device)


def _restore_kv(engine: Sleeper) -> None:
    shape, dtype = engine.sleep_kv_shape
    kv = engine.runner.kv
    kv.k = torch.zeros(shape, dtype=dtype, device=engine.device)  # [layers, Hkv, slots, d]
    kv.v = torch.zeros(shape, dtype=dtype, device=engine.device)
    if engine.runner.states is not None:
        engine.runner.states.restore()


def _move_weights(model: torch.nn.Module, device: torch.device) -> None:
    """Every parameter to `device` (a no-op on CPU, where host memory is the device's)."""
    for p in model.parameters():
        if p.device != device:
            p.data = p.data.to(device)
    _empty_device_cache(device)


def _discard_weights(model: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    shapes = {}
    for name, p in model.named_parameters():
        shapes[name] = (tuple(p.shape), p.dtype)
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)
    packed_weights.forget()  # the prepacked copies of CPU half weights go with them
    _empty_device_cache(next(model.parameters()).device)
    return shapes


def _allocate_weights(model: torch.nn.Module, shapes: dict[str, tuple[tuple[int, ...], torch.dtype]],
                      device: torch.device) -> None:
    for name, p in model.named_parameters():
        shape, dtype = shapes[name]
        p.data = torch.zeros(shape, dtype=dtype, device=device)


def _empty_device_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
