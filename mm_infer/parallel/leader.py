"""LeaderEngine: rank 0 of a tensor-parallel engine. It serves every caller as an LLMEngine does, and sends each
call that changes engine state to the other ranks first, so every rank's scheduler, caches and samplers stay equal.

Every rank runs the same engine: the same scheduler over the same requests, the same model shard's forward, and
the same sampler over the same logits (vocab-parallel logits are gathered whole on every rank) with the same
seeds. So every rank samples the same token without a second broadcast, and the only traffic besides the model's
collectives is the command of each call: a prepared request once, then one small message per step. A checksum of
each step's scheduled batch follows, before its forward; a rank whose own batch differs stops (RankLostError)."""

from __future__ import annotations

import pickle
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from mm_infer.config import EngineConfig
from mm_infer.engine.control.sleep_state import SleepState
from mm_infer.engine.engine import COMPILE, LLMEngine
from mm_infer.engine.outputs.request_output import RequestOutput
from mm_infer.engine.runtime import pick_device
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.engine.scheduling.scheduler import SchedulerOutput
from mm_infer.models.config import load_config
from mm_infer.parallel.group import RankGroup, RankLostError
from mm_infer.parallel.plan import check_splittable
from mm_infer.prompt.preparer import Prompt

STARTUP_TIMEOUT = timedelta(seconds=600)  # every rank has joined the group by then
COLLECTIVE_TIMEOUT = timedelta(seconds=600)  # a model collective no rank answers within this fails


def batch_digest(batch: SchedulerOutput) -> int:
    """A checksum of a scheduled batch: each chunk's request, sample, span and last token. Equal on ranks that
    scheduled alike, which they do only if every earlier call and sampled token was the same."""
    chunks = [(c.seq.group.request_id, c.seq.index, c.start, c.end, c.seq.token_ids[-1]) for c in batch.chunks]
    return zlib.crc32(repr(chunks).encode())


class LeaderEngine(LLMEngine):
    """Rank 0: starts ranks 1..size-1 (follower.py, one process each), then mirrors its state-changing calls."""

    def __init__(self, config: EngineConfig, tokenizer: Any = None) -> None:
        size = config.tensor_parallel_size
        check_splittable(load_config(config.model_dir), size)  # refused before any process starts
        config = ranked_threads(config)
        self.followers: list[subprocess.Popen] = []
        group = self._start(config)
        try:
            super().__init__(config, tokenizer, group)
        except BaseException:
            self._stop_followers()
            raise
        self.group = group

    def _start(self, config: EngineConfig) -> RankGroup:
        """Host the rendezvous, start the followers, and open the groups (failing early if a follower dies)."""
        size = config.tensor_parallel_size
        store = dist.TCPStore("127.0.0.1", 0, size, True, timeout=STARTUP_TIMEOUT, wait_for_workers=False)
        for rank in range(1, size):
            proc = subprocess.Popen([sys.executable, "-m", "mm_infer.parallel.follower"], stdin=subprocess.PIPE)
            self.followers.append(proc)
            assert proc.stdin is not None
            try:
                proc.stdin.write(pickle.dumps((config, rank, store.port)))
                proc.stdin.close()
            except BrokenPipeError:
                pass  # it died at once: _watched reports its exit code
        device = pick_device(config.device)
        return self._watched(lambda: RankGroup.open(store, 0, size, device, config.tp_deterministic,
                                                    COLLECTIVE_TIMEOUT))

    def _watched(self, join: Any) -> RankGroup:
        """join() on a side thread while the followers are watched: one that exits fails the start at once."""
        result: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: result.update(group=_catch(join)), daemon=True)
        thread.start()
        while thread.is_alive():
            dead = [(r + 1, p.returncode) for r, p in enumerate(self.followers) if p.poll() is not None]
            if dead:
                self._stop_followers()
                raise RankLostError(f"tensor-parallel rank {dead[0][0]} exited with code {dead[0][1]} while "
                                    f"starting (its log is above)")
            thread.join(0.05)
        group = result["group"]
        if isinstance(group, BaseException):
            self._stop_followers()
            raise group
        return group

    # --- calls mirrored on every rank ------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
                    grammar: Any = COMPILE) -> None:
        """Prepared and checked here; the other ranks get the prepared request and the seeds drawn here."""
        super().add_request(request_id, prompt, params, grammar)
        group = self.groups[request_id]
        self.group.send(("add", request_id, group.request, group.params, [s.seed for s in group.seqs]))

    def step(self) -> list[RequestOutput]:
        held = [rid for rid, g in self.groups.items() if g.held]  # slow readers, known only here
        self.group.send(("step", held))
        return super().step()

    def _check_batch(self, batch: SchedulerOutput) -> None:
        """Send this step's batch checksum; a rank that scheduled otherwise stops before the forward (no
        collective of mismatched shapes ever starts)."""
        self.group.send(batch_digest(batch))

    def abort(self, request_id: str) -> RequestOutput | None:
        out = super().abort(request_id)
        if out is not None:
            self.group.send(("abort", request_id))
        return out

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> set[str]:
        """Every rank gets the whole tensors, broadcast over the model's group (NCCL on CUDA: device to device, no
        pickling), and keeps its slice; only their names, shapes and dtypes travel as a command."""
        tensors = [(name, t.detach().to(self.device).contiguous()) for name, t in named_tensors]
        self.group.send(("weights", [(name, tuple(t.shape), t.dtype) for name, t in tensors], version))
        for _, t in tensors:
            self.group.broadcast(t)
        return super().update_weights(tensors, version)

    def reset_caches(self) -> None:
        self.group.send(("reset",))
        super().reset_caches()

    def sleep(self, level: int) -> SleepState:
        state = super().sleep(level)  # refused here (requests in flight) before any rank sleeps
        self.group.send(("sleep", level))
        return state

    def wake_up(self, tags: Iterable[str] | None = None) -> SleepState:
        tags = None if tags is None else list(tags)
        state = super().wake_up(tags)
        self.group.send(("wake", tags))
        return state

    def close(self) -> None:
        """Tell the followers to stop, wait for them (killed if they do not), then release this rank's buffers."""
        if self.followers and all(p.poll() is None for p in self.followers):
            try:
                self.group.send(("close",))
            except RankLostError:
                pass
        self._stop_followers()
        super().close()

    def _stop_followers(self, grace_s: float = 10.0) -> None:
        deadline = time.monotonic() + grace_s
        for proc in self.followers:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.followers = []

    def __del__(self) -> None:
        for proc in getattr(self, "followers", []):
            if proc.poll() is None:
                proc.kill()


def ranked_threads(config: EngineConfig) -> EngineConfig:
    """On CPU with no thread count set, each rank takes an equal share of torch's threads (the same total)."""
    if config.cpu_threads or pick_device(config.device).type == "cuda":
        return config
    return replace(config, cpu_threads=max(torch.get_num_threads() // config.tensor_parallel_size, 1))


def _catch(fn: Any) -> Any:
    try:
        return fn()
    except BaseException as exc:  # handed to the waiting thread
        return exc
