"""WeightReceiver: an engine's end of a weight-transfer group; broadcasts land in staging buffers, swapped in whole."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from mm_infer.models.loader import loadable_tensors, stored_shape, tensor_fits, tensor_target
from mm_infer.transfer.collective import BroadcastGroup, join_group
from mm_infer.transfer.packing import DEFAULT_BUFFER_BYTES, DEFAULT_NUM_BUFFERS, TensorMeta, chunk_plan, unpack


@dataclass(frozen=True)
class TransferInit:
    """init_info of /init_weight_transfer_engine (vLLM's fields) plus the server's backend."""

    backend: str
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    packed: bool = False  # vLLM's worker default; TRL sends packed in update_info
    packed_buffer_size_bytes: int = DEFAULT_BUFFER_BYTES
    packed_num_buffers: int = DEFAULT_NUM_BUFFERS
    timeout_s: float = 300.0


@dataclass(frozen=True)
class TransferUpdate:
    """update_info of /update_weights: the tensors in broadcast order; packed / buffer size override init's."""

    metas: tuple[TensorMeta, ...]
    packed: bool | None = None
    packed_buffer_size_bytes: int | None = None


class TransferFailedError(RuntimeError):
    """The broadcast broke off: nothing of it was loaded, and the group must be initialised again."""


def check_metas(model: torch.nn.Module, metas: Sequence[TensorMeta]) -> None:
    """Every announced name maps to a parameter of `model` with a shape it accepts (ValueError naming the first
    that does not). Dtypes may differ: tensors are converted on load."""
    params = loadable_tensors(model)
    tied = getattr(model, "lm_head", None) is None
    for meta in metas:
        target = tensor_target(model)(meta.name)
        if target is None or (target[0] == "lm_head.weight" and tied):
            continue  # names a checkpoint may carry that this model does not load (rotary buffers, a tied head)
        name, part = target
        if name not in params:
            raise ValueError(f"tensor {meta.name!r} maps to no parameter of this model")
        want = stored_shape(model, params, name, part)
        if not tensor_fits(name, meta.shape, want):
            raise ValueError(f"tensor {meta.name!r} has shape {list(meta.shape)}, the model wants {list(want)}")


@dataclass
class WeightReceiver:
    """Joins at rank_offset + its replica index, receives a round's broadcasts into staging, and hands the staged
    (name, tensor) pairs over only once every announced tensor arrived."""

    device: torch.device
    replica_index: int = 0
    group: BroadcastGroup | None = None
    init: TransferInit | None = None
    staged: list[tuple[str, Tensor]] = field(default_factory=list)
    received_bytes: int = 0
    receive_seconds: float = 0.0

    def join(self, init: TransferInit) -> int:
        """Blocks until the trainer (rank 0) and every other engine joined; returns this engine's rank."""
        self.close()
        rank = init.rank_offset + self.replica_index
        if not 0 < rank < init.world_size:
            raise ValueError(f"rank {rank} (rank_offset {init.rank_offset} + replica {self.replica_index}) is "
                             f"outside 1..{init.world_size - 1}: rank 0 is the trainer")
        self.group = join_group(init.backend, init.master_address, init.master_port, rank, init.world_size,
                                init.timeout_s, self.device)
        self.init = init
        return rank

    def receive(self, update: TransferUpdate) -> int:
        """Receive one update_info's tensors into staging (added to what this round staged already); returns how
        many. A failure drops the round's staging and leaves the group (TransferFailedError says how far it got)."""
        if self.group is None or self.init is None:
            raise RuntimeError("no weight transfer group: POST /init_weight_transfer_engine first")
        packed = self.init.packed if update.packed is None else update.packed
        size = update.packed_buffer_size_bytes or self.init.packed_buffer_size_bytes
        chunks = chunk_plan(update.metas, size) if packed else [[i] for i in range(len(update.metas))]
        done, start = 0, time.perf_counter()
        try:
            for chunk in chunks:
                metas = [update.metas[i] for i in chunk]
                buffer = torch.empty(sum(m.nbytes for m in metas), dtype=torch.uint8, device=self.device)  # [bytes]
                self.group.broadcast(buffer, src=0)
                self.staged.extend(unpack(buffer, metas))
                self.received_bytes += buffer.numel()
                done += len(chunk)
        except Exception as exc:
            self.discard()
            self.close()
            raise TransferFailedError(f"the broadcast broke off after {done} of {len(update.metas)} tensors "
                                      f"({type(exc).__name__}: {exc})") from None
        self.receive_seconds += time.perf_counter() - start
        return done

    def take(self) -> list[tuple[str, Tensor]]:
        """The round's staged tensors (the receiver forgets them)."""
        staged, self.staged = self.staged, []
        self.received_bytes, self.receive_seconds = 0, 0.0
        return staged

    def discard(self) -> None:
        self.take()

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        self.group, self.init = None, None
