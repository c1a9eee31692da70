"""Torch intra-op threads per step: heavy steps (media to encode, long prompts) may use more cores than decode."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from mm_infer.engine.batch_plan import BatchPlan

# A step of at least this many tokens (or with media to embed) counts as heavy.
HEAVY_STEP_TOKENS = 256


@dataclass(frozen=True)
class StepThreads:
    """`heavy` threads for heavy steps, else the process's setting. Why: in the server's layout the core keeps one
    thread, leaving a core to the server process, which streams every decode step's outputs; while the core
    encodes a wave of images or prefills long prompts, those requests wait for it and the server has little to do,
    so the spare core can take half the GEMMs. On the CPU, MKL and the attention kernels split rows or heads
    between threads, not a dot product, so the numbers do not change (a test holds it)."""

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
