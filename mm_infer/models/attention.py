"""The LM's attention seam: an AttentionContext protocol and a cache-free dense causal implementation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor


@runtime_checkable
class AttentionContext(Protocol):
    """Per-batch attention for flat, unpadded token batches; the engine backs it with a paged KV cache."""

    def attend(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q [N, Hq, d], k/v [N, Hkv, d] (q, k already rotated) -> [N, Hq, d]."""
        ...


def causal_attention_batch(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal GQA attention for n sequences of one shape, whose queries are their last Lq keys, as one bmm pair.

    q [n, Lq, Hq, d], k/v [n, Lk, Hkv, d] with Lk >= Lq -> [n, Lq, Hq, d].

    These are the steps of torch's math SDPA kernel, written out: q and k each scaled by sqrt(d^-0.5), an additive
    -inf mask, softmax, half types computed in float32. On the CPU each sequence's rows come out bit for bit as a
    3-D SDPA call on that sequence alone gives them (a test holds it), whatever n. Its causal and masked forms also
    round alike, so a chunk after a prefix-cache hit equals the same rows of a full prefill. (The 4-D flash kernel
    is faster per call, but its causal and masked paths round differently, and hits stop matching misses.) SDPA's
    guard for rows with every key masked is left out: a causal row always keeps its own key.
    """
    dtype = q.dtype
    if dtype in (torch.float16, torch.bfloat16):
        q, k, v = q.float(), k.float(), v.float()
    n, lq, hq, d = q.shape
    lk, hkv = k.shape[1], k.shape[2]
    rep = hq // hkv
    root_scale = math.sqrt(d**-0.5)
    qh = (q.transpose(1, 2) * root_scale).reshape(n * hq, lq, d)  # [n*Hq, Lq, d]
    kh = k.transpose(1, 2).repeat_interleave(rep, dim=1).reshape(n * hq, lk, d)  # [n*Hq, Lk, d]
    vh = v.transpose(1, 2).repeat_interleave(rep, dim=1).reshape(n * hq, lk, d)
    keep = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)  # query i sits at key lk - lq + i
    bias = torch.zeros(lq, lk, dtype=q.dtype, device=q.device).masked_fill_(keep.logical_not_(), float("-inf"))
    scores = torch.bmm(qh, kh.transpose(1, 2) * root_scale).add_(bias)  # [n*Hq, Lq, Lk]
    out = torch.bmm(torch.softmax(scores, dim=-1), vh)  # [n*Hq, Lq, d]
    return out.view(n, hq, lq, d).transpose(1, 2).to(dtype)


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal GQA attention for one sequence whose queries are its last q.shape[0] keys (causal_attention_batch).

    q [Lq, Hq, d], k/v [Lk, Hkv, d] with Lk >= Lq -> [Lq, Hq, d].
    """
    return causal_attention_batch(q[None], k[None], v[None])[0]


def equal_runs(values: Sequence[int]) -> list[tuple[int, int]]:
    """(first index, count) of each maximal run of consecutive equal values."""
    runs: list[tuple[int, int]] = []
    for i, value in enumerate(values):
        if runs and values[runs[-1][0]] == value:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


class DenseAttentionContext:
    """Causal attention run independently on each of several concatenated sequences; no KV cache. Consecutive
    sequences of one length run as one batch (causal_attention_batch: the same numbers as one at a time)."""

    def __init__(self, seq_lens: Sequence[int]) -> None:
        self.seq_lens = [int(n) for n in seq_lens]
        if any(n <= 0 for n in self.seq_lens):
            raise ValueError(f"sequence lengths must be positive, got {self.seq_lens}")

    def attend(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if q.shape[0] != sum(self.seq_lens):
            raise ValueError(f"{q.shape[0]} tokens but seq_lens sum to {sum(self.seq_lens)}")
        out = torch.empty_like(q)  # [N, Hq, d]
        start = 0
        for first, count in equal_runs(self.seq_lens):
            length = self.seq_lens[first]
            rows = slice(start, start + count * length)
            q_run, k_run, v_run = (x[rows].view(count, length, *x.shape[1:]) for x in (q, k, v))
            out[rows] = causal_attention_batch(q_run, k_run, v_run).reshape(count * length, *q.shape[1:])
            start += count * length
        return out
