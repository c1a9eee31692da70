"""Shared by the GPU check scripts: figure printing, timing (CUDA events on CUDA), H200 constants."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

HBM_PEAK = 4.8e12  # H200 HBM3e, bytes/s
BLOCK = 16
Report = dict[str, Any]


def say(name: str, value: object) -> None:
    print(f"{name}: {value}", flush=True)


def median_ms(fn: Callable[..., object], device: str, setup: Callable[[], object] | None = None,
              events: bool = False, warmup: int = 3, iters: int = 10) -> float:
    """Median ms of fn(setup()) (setup untimed), synchronised around each call; CUDA events when `events`."""
    cuda = device.startswith("cuda")
    events &= cuda
    times = []
    for i in range(warmup + iters):
        args = () if setup is None else (setup(),)
        if cuda:
            torch.cuda.synchronize()
        if events:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        fn(*args)
        if events:
            end.record()
        if cuda:
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end) if events else (time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def graph_counts(llm: Any) -> list[int]:
    """[decode graphs captured, captures that failed] of an LLM's engine (rank 0 under tensor parallelism)."""
    graphs = llm.engine.runner.graphs
    return [0, 0] if graphs is None else list(graphs.capture_counts())
