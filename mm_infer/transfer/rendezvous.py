"""The rendezvous of a weight-transfer group (vLLM's): a TCPStore served by rank 0 at master_address:master_port."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist


def tcp_store(master_address: str, master_port: int, rank: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0 serves the store; the others connect to it (and wait up to timeout_s for it)."""
    return dist.TCPStore(master_address, master_port, world_size, is_master=rank == 0,
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
