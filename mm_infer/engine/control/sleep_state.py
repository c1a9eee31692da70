"""What a sleep released (vLLM's levels), and the error a request meets while the engine cannot serve."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

WeightsState = Literal["loaded", "offloaded", "discarded", "unloaded"]  # unloaded: memory back, values not yet


class EngineAsleepError(RuntimeError):
    """The engine cannot serve now (asleep, or its weights not reloaded since a level-2 sleep); says which (503)."""

    status = 503


@dataclass
class SleepState:
    level: int = 0  # the deepest level slept at since the last full wake-up
    kv_freed: bool = False
    weights: WeightsState = "loaded"
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = field(default_factory=dict)  # discarded params
    reloaded: set[str] = field(default_factory=set)  # parameters refit since a level-2 wake-up

    @property
    def is_sleeping(self) -> bool:
        return self.kv_freed or self.weights in ("offloaded", "discarded")

    def reason(self) -> str | None:
        """Why a request is refused now (None: the engine serves)."""
        if self.is_sleeping:
            held = [what for what, gone in (("the KV cache", self.kv_freed),
                                            ("the weights", self.weights in ("offloaded", "discarded"))) if gone]
            return (f"the engine is asleep (level {self.level}: {' and '.join(held)} released); "
                    "POST /wake_up first")
        if self.weights == "unloaded":
            return ("the weights were discarded by a level-2 sleep and not reloaded since: refit every weight "
                    "(/update_weights or /update_weights_from_disk) before serving")
        return None

    def note_refit(self, filled: set[str], every: set[str]) -> None:
        """After a level-2 wake-up the engine serves again once every parameter (`every`) was refit."""
        if self.weights != "unloaded":
            return
        self.reloaded |= filled
        if self.reloaded >= every:
            self.weights, self.reloaded = "loaded", set()
