"""A tensor-parallel rank other than 0: builds its engine shard, then replays rank 0's commands until told to stop
(`python -m mm_infer.parallel.follower`, its start arguments pickled on stdin)."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from mm_infer.config import EngineConfig
from mm_infer.engine.engine import LLMEngine
from mm_infer.engine.runtime import pick_device
from mm_infer.engine.scheduling.scheduler import SchedulerOutput
from mm_infer.parallel.group import RankGroup, RankLostError
from mm_infer.parallel.leader import COLLECTIVE_TIMEOUT, STARTUP_TIMEOUT, batch_digest

PARENT_POLL_S = 0.5


def _die_with_parent() -> None:
    """End this process soon after rank 0's process ends, whatever this one is doing (a watch thread: a collective
    with a dead peer fails by itself, but a rank busy elsewhere would not notice). Ctrl-C is left to rank 0."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(4)

    threading.Thread(target=watch, name="mm-infer-rank-watch", daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class FollowerEngine(LLMEngine):
    """A rank's engine: it checks each batch it schedules against rank 0's before running it."""

    def __init__(self, config: EngineConfig, group: RankGroup) -> None:
        super().__init__(config, group=group)
        self.group = group

    def _check_batch(self, batch: SchedulerOutput) -> None:
        if self.group.receive() != batch_digest(batch):
            raise RankLostError(f"rank {self.group.rank} scheduled a different batch from rank 0's: the ranks are "
                                f"out of step (a call or a sampled token differed)")


class Follower:
    """Applies each command of rank 0 to this rank's engine."""

    def __init__(self, engine: LLMEngine, group: RankGroup) -> None:
        self.engine, self.group = engine, group
        self.handlers: dict[str, Callable[..., Any]] = {
            "add": self.add, "step": self.step, "abort": engine.abort, "weights": self.weights,
            "reset": engine.reset_caches, "sleep": engine.sleep, "wake": engine.wake_up}

    def serve(self) -> None:
        while True:
            name, *args = self.group.receive()
            if name == "close":
                return
            self.handlers[name](*args)

    def add(self, request_id: str, request: Any, params: Any, seeds: list[int]) -> None:
        self.engine.add_request(request_id, request, params)
        for seq, seed in zip(self.engine.groups[request_id].seqs, seeds, strict=True):
            seq.seed = seed

    def weights(self, metas: list[tuple[str, tuple[int, ...], Any]], version: int) -> None:
        """Receive rank 0's whole tensors (broadcast one by one) and load this rank's slices of them."""
        device = self.engine.device
        tensors = [(name, self.group.broadcast(torch.empty(shape, dtype=dtype, device=device)))
                   for name, shape, dtype in metas]
        self.engine.update_weights(tensors, version)

    def step(self, held: list[str]) -> None:
        held_ids = set(held)
        for rid, g in self.engine.groups.items():
            g.held = rid in held_ids
        self.engine.step()


def main() -> None:
    _die_with_parent()
    config, rank, port = pickle.load(sys.stdin.buffer)
    assert isinstance(config, EngineConfig)
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, config.tensor_parallel_size, False, timeout=STARTUP_TIMEOUT)
    group = RankGroup.open(store, rank, config.tensor_parallel_size, pick_device(config.device),
                           config.tp_deterministic, COLLECTIVE_TIMEOUT)
    engine = FollowerEngine(config, group)
    try:
        Follower(engine, group).serve()
    except RankLostError as exc:
        print(f"mm-infer tensor-parallel rank {rank}: {exc}", file=sys.stderr, flush=True)
        sys.exit(3)  # rank 0 is gone (or this rank fell out of step): nothing left to serve


if __name__ == "__main__":
    main()
