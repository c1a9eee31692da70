"""Rollouts for GRPO: rows of (prompt with media, ground truth) -> groups of n exact samples with rewards."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mm_infer.engine.engine import LLMEngine
from mm_infer.engine.errors import RequestFailedError
from mm_infer.engine.outputs.request_output import RequestOutput
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.prompt.request import MediaItem, VLMRequest

RewardFn = Callable[[str, Any], float]
_ids = itertools.count()


class RolloutAbortedError(RuntimeError):
    """A sample ended by abort: it is never scored as if it had completed. `.partial` keeps what it made."""

    def __init__(self, message: str, partial: RequestOutput) -> None:
        super().__init__(message)
        self.partial = partial


@dataclass(frozen=True)
class RolloutRow:
    """One dataset row: an engine prompt dict (messages or ids, multi_modal_data, ...) and its ground truth."""

    prompt: Mapping[str, Any]
    ground_truth: Any = None


@dataclass
class RolloutSample:
    """One sampled completion exactly as the engine produced it."""

    token_ids: list[int]
    logprobs: list[float]  # one per token: log p(token | prefix) under the rollout weights
    text: str
    finish_reason: str
    reward: float
    # R3 (engine with enable_return_routed_experts): [prompt + generated - 1, layers, top_k] expert ids to replay
    routed_experts: np.ndarray | None = None


@dataclass
class RolloutGroup:
    """The n samples of one prompt. Media and prompt positions are stored once for the whole group."""

    row: RolloutRow
    request: VLMRequest  # expanded prompt ids, media items, M-RoPE positions
    samples: list[RolloutSample]
    weight_version: int

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.request.prompt_token_ids

    @property
    def media(self) -> list[MediaItem]:
        return self.request.items

    def positions(self, sample: int) -> Tensor:
        """M-RoPE positions [3, prompt + generated] for one sample, as the engine computed them."""
        prompt = self.request.mrope_positions  # [3, L]
        n_gen = len(self.samples[sample].token_ids)
        start = prompt.shape[1] + self.request.mrope_delta
        decode = torch.arange(start, start + n_gen, dtype=torch.long).expand(3, n_gen)  # [3, G]
        return torch.cat([prompt, decode], dim=1)

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """GRPO advantages: reward minus the group mean, over the group's standard deviation."""
    r = torch.tensor(rewards, dtype=torch.float64)
    std = r.std(unbiased=False) if len(rewards) > 1 else torch.tensor(0.0, dtype=torch.float64)
    return ((r - r.mean()) / (std + eps)).tolist()


def run_to_completion(engine: LLMEngine, request_ids: list[str]) -> dict[str, RequestOutput]:
    """Step the engine until every listed request has finished; their final outputs by id."""
    done: dict[str, RequestOutput] = {}
    wanted = set(request_ids)
    while len(done) < len(request_ids) and engine.has_unfinished():
        for out in engine.step():
            if out.finished and out.request_id in wanted:
                done[out.request_id] = out
    return done


def generate_rollouts(engine: LLMEngine, rows: Sequence[RolloutRow], reward_fn: RewardFn,
                      params: SamplingParams, *, weight_version: int = 0) -> list[RolloutGroup]:
    """Prepare each prompt once (media decoded once per group), sample n completions each, score them.

    All rows are queued together, so continuous batching and the prefix cache serve the whole batch.
    Any abort raises RolloutAbortedError with the partial output: an aborted sample is never scored. A request
    the engine failed raises RequestFailedError.
    """
    requests = [engine.prepare(row.prompt) for row in rows]  # bad input fails before anything is queued
    ids = [f"rollout-{next(_ids)}" for _ in rows]
    try:
        for rid, req in zip(ids, requests, strict=True):
            engine.add_request(rid, req, params.final_only())
        outputs = run_to_completion(engine, ids)
    except BaseException:
        engine.abort_many(ids)
        raise
    groups = []
    for rid, row, req in zip(ids, rows, requests, strict=True):
        out = outputs.get(rid)
        if out is None:
            raise RuntimeError(f"engine stopped before {rid} finished")
        if out.error is not None:
            raise RequestFailedError(out.error)
        aborted = [c for c in out.outputs if c.finish_reason == "abort"]
        if aborted:
            raise RolloutAbortedError(f"{rid}: {len(aborted)} of {len(out.outputs)} samples were aborted", out)
        samples = [RolloutSample(list(c.token_ids), list(c.logprobs), c.text, str(c.finish_reason),
                                 float(reward_fn(c.text, row.ground_truth)), c.routed_experts) for c in out.outputs]
        groups.append(RolloutGroup(row, req, samples, weight_version))
    return groups
