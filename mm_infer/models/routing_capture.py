"""RoutingCapture: a static device buffer the MoE layers write each token's top-k expert ids into during a forward
(rollout routing replay, R3), read back once per step."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def routing_dtype(num_experts: int) -> np.dtype:
    """vLLM's rule: uint8 ids up to 256 experts, uint16 above."""
    return np.dtype(np.uint8 if num_experts <= 256 else np.uint16)


class RoutingCapture:
    """[rows, num_layers, top_k] int32 on the model's device. Layer i of a forward writes its ids for the batch's
    rows into column i (a dense layer's column is never written and stays 0, as in vLLM). No host sync per layer:
    the buffer's address never changes, so a captured CUDA graph writes it too."""

    def __init__(self, rows: int, num_layers: int, top_k: int, num_experts: int, device: torch.device) -> None:
        self.buffer = torch.zeros(rows, num_layers, top_k, dtype=torch.int32, device=device)  # [R, L, k]
        self.dtype = routing_dtype(num_experts)

    def record(self, layer_idx: int, experts: Tensor) -> None:
        """experts [N, k] (the batch's rows, padding included) -> column layer_idx of rows [0, N)."""
        n = experts.shape[0]
        if n > self.buffer.shape[0]:
            raise ValueError(f"routing capture holds {self.buffer.shape[0]} rows; this forward has {n}")
        self.buffer[:n, layer_idx].copy_(experts)

    def take(self, n: int) -> np.ndarray:
        """The first n rows as host ids [n, L, k] (vLLM's dtype): one device-to-host copy per step."""
        return self.buffer[:n].cpu().numpy().astype(self.dtype)
