"""RoutingRows: one sequence's MoE routing (R3), a row of top-k expert ids per layer for each token it forwarded."""

from __future__ import annotations

import numpy as np


class RoutingRows:
    """Rows [positions, layers, top_k] for positions [0, length): row p is the routing the model computed when the
    token at position p was its input (the last sampled token never is). A chunk's rows are put at its start, so a
    recompute after preemption, or a restart at a prefix hit, overwrites what came after."""

    def __init__(self) -> None:
        self.data: np.ndarray | None = None  # [capacity, L, k]
        self.length = 0

    def put(self, start: int, rows: np.ndarray) -> None:
        """rows [n, L, k] for positions [start, start+n); the rows past them are dropped."""
        if start > self.length:
            raise ValueError(f"routing rows from position {start}, but only {self.length} are known")
        end = start + rows.shape[0]
        if self.data is None or self.data.shape[0] < end or self.data.shape[1:] != rows.shape[1:]:
            grown = np.zeros((max(end, 2 * (0 if self.data is None else self.data.shape[0]), 16), *rows.shape[1:]),
                             dtype=rows.dtype)
            if self.data is not None and self.data.shape[1:] == rows.shape[1:]:
                grown[:start] = self.data[:start]
            self.data = grown
        self.data[start:end] = rows
        self.length = end

    def rows(self, start: int, end: int) -> np.ndarray:
        """A copy of rows [start, min(end, length)) ([0, L, k] when none)."""
        if self.data is None:
            raise ValueError("no routing rows were recorded")
        return self.data[start:min(end, self.length)].copy()
