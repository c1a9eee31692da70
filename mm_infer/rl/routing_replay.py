"""The trainer's side of R3: a returned routing as per-layer expert ids, and an HF MoE forward that routes every
token to the experts the rollout chose (weights still the trainer's router probabilities at those experts)."""

from __future__ import annotations

import base64
import contextlib
import io
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor, nn


def decode_routed_experts(encoded: str) -> np.ndarray:
    """A response's `routed_experts` (base64 of `.npy` bytes) -> [rows, layers, top_k]."""
    return np.load(io.BytesIO(base64.b64decode(encoded)), allow_pickle=False)


def routing_tensors(routing: np.ndarray, layers: list[int], start: int = 0) -> dict[int, Tensor]:
    """[rows, L, k] ids of positions [start, start + rows) -> {layer: long [rows, k]} for the MoE layers given."""
    if routing.ndim != 3:
        raise ValueError(f"routing must be [rows, layers, top_k], got shape {routing.shape}")
    return {i: torch.from_numpy(routing[:, i].astype(np.int64)) for i in layers}


def _sparse_gates(model: nn.Module) -> dict[int, nn.Module]:
    """Decoder layer -> its MoE router, for HF Qwen3-VL-MoE-style models (`layers[i].mlp.gate` returning
    (logits, weights, experts))."""
    layers = model.model.language_model.layers  # type: ignore[union-attr]
    return {i: layer.mlp.gate for i, layer in enumerate(layers)
            if hasattr(layer.mlp, "gate") and not isinstance(layer.mlp.gate, nn.Linear)}


def _forced(experts: Tensor, start: int):
    """A forward hook that swaps the router's choice for `experts` on positions [start, start + rows): weights are
    the router's softmax at the forced experts, renormalised over them (HF's top-k renormalisation)."""

    def hook(_module: nn.Module, _inputs: tuple, output: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, ...]:
        logits, weights, chosen = output  # [T, E], [T, k], [T, k]; a batch of one sequence
        end = min(chosen.shape[0], start + experts.shape[0])
        chosen = chosen.clone()
        chosen[start:end] = experts[:end - start].to(chosen.device)
        probs = torch.softmax(logits.float(), dim=-1).gather(1, chosen)  # [T, k]
        return logits, (probs / probs.sum(-1, keepdim=True)).to(weights.dtype), chosen

    return hook


@contextlib.contextmanager
def replayed_routing(model: nn.Module, routing: np.ndarray, start: int = 0) -> Iterator[None]:
    """Within the block, `model`'s forward over one sequence routes positions [start, start + rows) as `routing`
    says (the rollout's R3 array; a position past it, like the last token, keeps the trainer's own choice)."""
    gates = _sparse_gates(model)
    if not gates:
        raise ValueError("this model has no MoE router to replay a routing into")
    forced = routing_tensors(routing, sorted(gates), start)
    hooks = [gate.register_forward_hook(_forced(forced[i], start)) for i, gate in gates.items()]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
