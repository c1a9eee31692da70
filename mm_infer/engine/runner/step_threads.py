"""Torch intra-op threads per step: heavy steps (media to encode, long prompts) may use more cores than decode."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import torch

from mm_infer.engine.runner.batch_plan import BatchPlan

# A step of at least this many tokens (or with media to embed) counts as heavy.
HEAVY_STEP_TOKENS = 256
log = logging.getLogger(__name__)


@lru_cache(maxsize=8)
def thread_count_changes_numbers(light: int, heavy: int) -> bool:
    """Whether float32 GEMMs of decode- and prefill-like shapes give other bits on `heavy` threads than on `light`.

    MKL on AVX-512 CPUs splits a dot product between threads for some shapes unless its strict reproducible mode is
    on (MKL_CBWR, set by mm_infer/__init__.py): this probe checks the CPU and BLAS actually running, in a few ms."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(1024, 1536, generator=gen)  # [N, K]: K long enough to be split
    xs = [torch.randn(rows, 1536, generator=gen) for rows in (1, 16, 64, 300)]  # [M, K]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(light)
        want = [x @ w.t() for x in xs]
        torch.set_num_threads(heavy)
        return any(not torch.equal(x @ w.t(), ref) for x, ref in zip(xs, want, strict=True))
    finally:
        torch.set_num_threads(before)


def checked_heavy_threads(light: int, heavy: int | None) -> int | None:
    """`heavy`, or None (never switch) when switching would change a request's numbers on this machine."""
    if heavy is None or heavy == light or not thread_count_changes_numbers(light, heavy):
        return heavy
    log.warning("heavy steps stay on %d thread(s): this CPU's BLAS gives other float bits on %d", light, heavy)
    return None


@dataclass(frozen=True)
class StepThreads:
    """`heavy` threads for heavy steps, else the process's setting. Why: in the server's layout the core keeps one
    thread, leaving a core to the server process, which streams every decode step's outputs; while the core
    encodes a wave of images or prefills long prompts, those requests wait for it and the server has little to do,
    so the spare core can take half the GEMMs. On the CPU, the attention kernels split rows or heads between
    threads, and MKL in its strict reproducible mode gives the same bits on any thread count; the engine checks
    that at start (checked_heavy_threads) and never switches where it does not hold (a test holds it)."""

    heavy: int | None = None  # None: never switch

    @staticmethod
    def is_heavy(plan: BatchPlan) -> bool:
        return bool(plan.media) or len(plan.token_ids) >= HEAVY_STEP_TOKENS

    @contextlib.contextmanager
    def for_plan(self, plan: BatchPlan) -> Iterator[None]:
        light = torch.get_num_threads()
        switch = self.heavy is not None and self.heavy != light and self.is_heavy(plan)
        if switch:
            torch.set_num_threads(self.heavy)  # type: ignore[arg-type]
        try:
            yield
        finally:
            if switch:
                torch.set_num_threads(light)
