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


# Prefill scores (float32 [sequences * Hq, query rows, keys]) are kept under this many bytes a tile: longer prefills
# run in query tiles, so their peak is linear in the context, not quadratic.
SCORE_TILE_BYTES = 64 << 20
# The fewest query rows of a tile: CPU GEMMs give row-invariant results from this many rows up (model_runner.MIN_ROWS).
MIN_TILE_ROWS = 16


def query_tile_rows(hq: int, lq: int, lk: int) -> int:
    """Query rows per tile of one sequence: all Lq when its scores fit SCORE_TILE_BYTES, else the most that fit,
    a multiple of MIN_TILE_ROWS (at least MIN_TILE_ROWS). A function of the sequence's own shape, never of its batch."""
    row_bytes = hq * lk * 4  # one query row's float32 scores over every head
    if lq * row_bytes <= SCORE_TILE_BYTES:
        return lq
    return max(SCORE_TILE_BYTES // row_bytes // MIN_TILE_ROWS, 1) * MIN_TILE_ROWS


def query_tiles(lq: int, rows: int) -> list[tuple[int, int, int]]:
    """(first row, end row, first row written) of each tile of `rows` query rows. The last tile ends at Lq and starts
    `rows` before it, so no tile is shorter than the others (a short GEMM may round differently); it writes only the
    rows the tile before left."""
    if rows >= lq:
        return [(0, lq, 0)]
    starts = range(0, lq - rows + 1, rows)
    tiles = [(r0, r0 + rows, r0) for r0 in starts]
    if tiles[-1][1] < lq:
        tiles.append((lq - rows, lq, tiles[-1][1]))
    return tiles


def _causal_tile(qh: Tensor, kh: Tensor, vh: Tensor, r0: int, r1: int, min_rows: int = 0) -> Tensor:
    """Query rows [r0, r1) of qh [B, Lq, d] over all of kh/vh [B, Lk, d] (q and k already scaled by sqrt(d^-0.5);
    queries are the last Lq keys) -> [B, r1-r0, d].

    Every tile reads all Lk keys, masked, as the untiled product does: the PV GEMM's reduction over keys then has
    one length, and its rows round alike (over fewer keys the BLAS may split the sum differently)."""
    lq, lk = qh.shape[1], kh.shape[1]
    keep = torch.ones(r1 - r0, lk, dtype=torch.bool, device=qh.device).tril(lk - lq + r0)  # row i: key lk-lq+r0+i
    bias = torch.zeros(r1 - r0, lk, dtype=qh.dtype, device=qh.device).masked_fill_(keep.logical_not_(), float("-inf"))
    q = qh[:, r0:r1]
    short = min_rows - (r1 - r0)
    if short > 0:  # batch invariance: a chunk after a prefix hit may have a few rows; zero rows make the GEMMs
        # min_rows long, where rows do not depend on the row count (the hit then equals a full prefill bit for bit)
        q = torch.cat([q, q.new_zeros(q.shape[0], short, q.shape[2])], dim=1)
        bias = torch.cat([bias, bias.new_zeros(short, lk)])
    scores = torch.bmm(q, kh.transpose(1, 2)).add_(bias)  # [B, max(r1-r0, MIN_TILE_ROWS), Lk]
    return torch.bmm(torch.softmax(scores, dim=-1), vh)[:, :r1 - r0]  # [B, r1-r0, d]


def causal_attention_batch(q: Tensor, k: Tensor, v: Tensor, min_rows: int = 0) -> Tensor:
    """Causal GQA attention for n sequences of one shape, whose queries are their last Lq keys, as bmm pairs.

    q [n, Lq, Hq, d], k/v [n, Lk, Hkv, d] with Lk >= Lq -> [n, Lq, Hq, d].

    These are the steps of torch's math SDPA kernel, written out: q and k each scaled by sqrt(d^-0.5), an additive
    -inf mask, softmax, half types computed in float32. On the CPU each sequence's rows come out bit for bit as a
    3-D SDPA call on that sequence alone gives them (a test holds it), whatever n. Its causal and masked forms also
    round alike, so a chunk after a prefix-cache hit equals the same rows of a full prefill. (The 4-D flash kernel
    is faster per call, but its causal and masked paths round differently, and hits stop matching misses.) SDPA's
    guard for rows with every key masked is left out: a causal row always keeps its own key.

    Memory: scores are made a tile at a time, under SCORE_TILE_BYTES (linear in Lk, not Lq x Lk). A long sequence's
    queries run in tiles of query_tile_rows (its own shape decides them, never its batch), each over all Lk keys;
    sequences run in groups that fit. Rows do not depend on the GEMM's row count from MIN_TILE_ROWS up, nor on the
    bmm batch count, so tiled rows equal the untiled ones bit for bit (a test holds it, under the default ATen
    capability too). Below MIN_TILE_ROWS they may: `min_rows` (batch invariance) pads a shorter tile with zero rows.
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
    kh = (kh.transpose(1, 2) * root_scale).transpose(1, 2)  # [n*Hq, Lk, d], memory as kh: bmm reads it transposed
    rows = query_tile_rows(hq, lq, lk)
    if rows == lq and n * lq * hq * lk * 4 <= SCORE_TILE_BYTES:
        out = _causal_tile(qh, kh, vh, 0, lq, min_rows)  # [n*Hq, Lq, d]
    else:
        out = torch.empty_like(qh)  # [n*Hq, Lq, d]
        group = max(SCORE_TILE_BYTES // (rows * hq * lk * 4), 1) * hq  # bmm batches (sequence x head) per call
        for b0 in range(0, n * hq, group):
            b = slice(b0, b0 + group)
            for r0, r1, w0 in query_tiles(lq, rows):
                out[b, w0:r1] = _causal_tile(qh[b], kh[b], vh[b], r0, r1, min_rows)[:, w0 - r0:]  # [group, r1-w0, d]
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
