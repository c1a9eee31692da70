"""RankGroup: the collectives one tensor-parallel rank takes part in (gloo on CPU, NCCL for CUDA tensors), plus
the CPU channel over which rank 0 sends its commands."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

COMMAND_TIMEOUT = timedelta(days=365)  # a follower waits for rank 0's next command as long as rank 0 lives
HEADER = 4096  # bytes of a command's first broadcast: its length, then its pickle when it fits (every step's do)


class RankLostError(RuntimeError):
    """A collective failed: another rank of this tensor-parallel group died or stopped answering."""


@dataclass
class RankGroup:
    """rank / size of this process in its group. `tensors` carries the model's collectives (gloo on CPU, NCCL on
    CUDA); `commands` (gloo) carries rank 0's pickled commands. deterministic: every all-reduce adds the ranks'
    partial sums in rank order (all-gather, then a left fold), so a row's result depends neither on the batch nor
    on the collective's algorithm; otherwise the backend's all-reduce runs (exact and order-free at 2 ranks)."""

    rank: int
    size: int
    tensors: Any
    commands: Any
    deterministic: bool = False
    store: Any = None  # keeps the TCPStore the groups rendezvoused through alive

    @staticmethod
    def open(store: Any, rank: int, size: int, device: torch.device, deterministic: bool,
             timeout: timedelta) -> RankGroup:
        """Open the groups over a rendezvous store (a TCPStore rank 0 hosts); returns once every rank joined."""
        commands = dist.ProcessGroupGloo(dist.PrefixStore("commands", store), rank, size, COMMAND_TIMEOUT)
        if device.type == "cuda":
            tensors = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), rank, size)
        else:
            tensors = dist.ProcessGroupGloo(dist.PrefixStore("tensors", store), rank, size, timeout)
        return RankGroup(rank, size, tensors, commands, deterministic, store)

    # --- the model's collectives ------------------------------------------------------------------------------

    def all_reduce(self, x: Tensor) -> Tensor:
        """The sum over ranks of x (same shape on every rank); every rank gets the same bits."""
        if self.deterministic:
            parts = self.all_gather(x)
            total = parts[0].clone()
            for part in parts[1:]:
                total += part
            return total
        x = x.contiguous()
        _wait(self.tensors.allreduce([x]))
        return x

    def all_gather(self, x: Tensor) -> list[Tensor]:
        """Every rank's x, in rank order."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        _wait(self.tensors.allgather([parts], [x]))
        return parts

    def gather_columns(self, x: Tensor) -> Tensor:
        """x [N, c] on each rank -> [N, size * c]: the ranks' column blocks side by side (vocab-parallel logits)."""
        return torch.cat(self.all_gather(x), dim=-1)

    def broadcast(self, x: Tensor) -> Tensor:
        """Rank 0's x into x on every rank (same shape and dtype, contiguous, on the model's device). Moved as its
        bytes: gloo has no float16 or float8 reductions, and a broadcast needs none."""
        _wait(self.tensors.broadcast(x.reshape(-1).view(torch.uint8), 0))
        return x

    def min_int(self, value: int) -> int:
        """The smallest of one integer over the ranks (the KV block count every rank can hold)."""
        return int(min(t.item() for t in self._gather_cpu(torch.tensor([value], dtype=torch.long))))

    def _gather_cpu(self, x: Tensor) -> list[Tensor]:
        parts = [torch.empty_like(x) for _ in range(self.size)]
        _wait(self.commands.allgather([parts], [x]))
        return parts

    # --- rank 0's commands ----------------------------------------------------------------------------------

    def send(self, command: Any) -> None:
        """Rank 0: one pickled command to every other rank. One broadcast of HEADER bytes (the length, then the
        pickle when it fits: every step's commands do); a longer pickle follows in a second one."""
        data = pickle.dumps(command, protocol=pickle.HIGHEST_PROTOCOL)
        header = torch.zeros(HEADER, dtype=torch.uint8)
        header[:8] = torch.tensor([len(data)], dtype=torch.long).view(torch.uint8)
        small = len(data) <= HEADER - 8
        if small:
            header[8:8 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        _wait(self.commands.broadcast(header, 0))
        if not small:
            _wait(self.commands.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), 0))

    def receive(self) -> Any:
        """Another rank: the next command rank 0 sends."""
        header = torch.empty(HEADER, dtype=torch.uint8)
        _wait(self.commands.broadcast(header, 0))
        length = int(header[:8].view(torch.long).item())
        if length <= HEADER - 8:
            return pickle.loads(header[8:8 + length].numpy().tobytes())
        data = torch.empty(length, dtype=torch.uint8)
        _wait(self.commands.broadcast(data, 0))
        return pickle.loads(data.numpy().tobytes())


def rank_device(device: torch.device, group: RankGroup | None) -> torch.device:
    """The device a rank runs on: CUDA device `rank` for a tensor-parallel rank on CUDA, else `device`."""
    if group is None or device.type != "cuda":
        return device
    torch.cuda.set_device(group.rank)
    return torch.device("cuda", group.rank)


def _wait(work: Any) -> None:
    """Wait for a collective; a failure (a peer gone, a timeout) becomes RankLostError."""
    try:
        work.wait()
    except RuntimeError as exc:
        raise RankLostError(f"a tensor-parallel rank is gone: {exc}") from exc
