"""Stateless broadcast groups between a trainer (rank 0) and engines: gloo on CPU, NCCL on CUDA (transfer/nccl.py).

Neither touches torch.distributed's default group, so a trainer's own process group and several transfer
groups can coexist. The rendezvous is vLLM's: a TCPStore served by rank 0 at master_address:master_port."""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from mm_infer.transfer.rendezvous import tcp_store

BACKENDS = ("gloo", "nccl")


class BroadcastGroup(Protocol):
    """What the weight transfer needs of a group: a broadcast from rank 0, and a way to leave."""

    rank: int
    world_size: int
    device: torch.device

    def broadcast(self, tensor: Tensor, src: int = 0) -> None: ...
    def close(self) -> None: ...


class GlooGroup:
    """A gloo process group of its own over a TCPStore: host tensors, any number of them per process."""

    def __init__(self, master_address: str, master_port: int, rank: int, world_size: int,
                 timeout_s: float = 300.0) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a group of world_size {world_size}")
        self.rank, self.world_size, self.device = rank, world_size, torch.device("cpu")
        self._store = tcp_store(master_address, master_port, rank, world_size, timeout_s)
        prefixed = dist.PrefixStore("mm_infer_weight_transfer", self._store)
        self._pg: dist.ProcessGroupGloo | None = dist.ProcessGroupGloo(prefixed, rank, world_size,
                                                                        timedelta(seconds=timeout_s))

    def broadcast(self, tensor: Tensor, src: int = 0) -> None:
        """In place: rank src sends `tensor`, every other rank receives into its own (same shape and dtype)."""
        if self._pg is None:
            raise RuntimeError("the transfer group was closed")
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        self._pg.broadcast([tensor], opts).wait()

    def close(self) -> None:
        self._pg = None
        self._store = None  # type: ignore[assignment]


def join_group(backend: str, master_address: str, master_port: int, rank: int, world_size: int,
               timeout_s: float = 300.0, device: torch.device | None = None) -> BroadcastGroup:
    """Join (rank 0: open) a transfer group; blocks until every rank has joined."""
    if backend == "gloo":
        return GlooGroup(master_address, master_port, rank, world_size, timeout_s)
    if backend == "nccl":
        from mm_infer.transfer.nccl import NcclGroup

        return NcclGroup(master_address, master_port, rank, world_size, timeout_s, device)
    raise ValueError(f"weight transfer backend {backend!r} is not one of {list(BACKENDS)}")
