"""ShardSpec: which piece of a stored (whole) tensor one rank's parameter holds, for loading and refits."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Piece:
    """Piece `index` of `count` equal pieces along `dim` of a part tensor."""

    dim: int
    index: int
    count: int

    def take(self, whole: Tensor, lead: int = 0) -> Tensor:
        dim = self.dim + lead
        size = whole.shape[dim]
        if size % self.count:
            raise ValueError(f"a dimension of {size} does not split into {self.count} tensor-parallel pieces")
        n = size // self.count
        return whole.narrow(dim, self.index * n, n)


@dataclass(frozen=True)
class ShardSpec:
    """How one parameter is sharded.

    parts: the Piece of each stored part (q, k, v; gate, up; one entry for an unfused parameter), cut from that
    part's own tensor. A tensor filling the whole parameter has `lead` more leading dimensions than a part (the
    stacked experts) and, when fused, holds the parts back to back along their dimension, `sizes` long each."""

    parts: tuple[Piece, ...]
    sizes: tuple[int, ...] = ()  # fused: each part's whole length along the parts' dimension
    lead: int = 0

    def _piece(self, part: int | None) -> Piece:
        return self.parts[0 if part is None else part % len(self.parts)]

    def take(self, stored: Tensor, part: int | None) -> Tensor:
        """This rank's slice of a stored tensor that fills `part` (None: the whole parameter)."""
        if part is not None:
            return self._piece(part).take(stored)
        if not self.sizes:
            return self.parts[0].take(stored, self.lead)
        dim = self.parts[0].dim + self.lead
        return torch.cat([p.take(chunk, self.lead) for p, chunk in
                          zip(self.parts, stored.split(list(self.sizes), dim=dim), strict=True)], dim=dim)

    def stored_shape(self, local: tuple[int, ...], part: int | None) -> tuple[int, ...]:
        """The shape a stored tensor filling `part` (None: the whole parameter) has, given this rank's view."""
        shape = list(local)
        piece = self._piece(part)
        dim = piece.dim + (0 if part is not None else self.lead)
        if part is None and self.sizes:
            shape[dim] = sum(self.sizes)
        else:
            shape[dim] *= piece.count
        return tuple(shape)


def shard_of(model: nn.Module, name: str) -> ShardSpec | None:
    """The ShardSpec of parameter `name` (None: whole on every rank, or no tensor parallelism)."""
    module_path, _, leaf = name.rpartition(".")
    specs = getattr(model.get_submodule(module_path), "tp_shards", None)
    return None if specs is None else specs.get(leaf)
