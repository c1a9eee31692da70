"""Decode steps over static buffers: one fixed-shape forward per batch-size bucket, captured as a CUDA graph on CUDA.

A pure decode step (every chunk one generated token, no media, no prompt scoring) is padded to the next bucket
size; its ids, positions, cache slots, block tables and lengths are copied into that bucket's device buffers, and
the bucket's forward (LM + logits) runs: replayed from a CUDA graph when captured, eagerly otherwise (CPU,
`enforce_eager`, or a capture that failed). Padding rows write to a scratch cache block no sequence owns and
attend to it alone, so they never touch real KV; a real row's table entries past its blocks hold the runner's zero
block, so its masked reads see zeros, never KV another sequence left behind.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from mm_infer.engine.runner.batch_plan import BatchPlan
from mm_infer.engine.runner.paged_attention import KVCache
from mm_infer.models.qwen_vl import QwenVLModel
from mm_infer_kernels import dispatch as K

log = logging.getLogger(__name__)


def bucket_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, 32, ... (steps of 8) up to and including max_num_seqs."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_num_seqs]
    sizes += list(range(16, max_num_seqs, 8))
    return sorted({*sizes, max_num_seqs})


@dataclass
class DecodeBuffers:
    """Device inputs and output of one bucket of `size` rows."""

    ids: Tensor  # [B] long
    positions: Tensor  # [3, B] long
    slots: Tensor  # [B] long, where each row's new K/V goes
    tables: Tensor  # [B, max_blocks] int32
    lens: Tensor  # [B] int32, context length including the new token
    logits: Tensor | None = None  # [B, V] float32, written by the forward

    @staticmethod
    def allocate(size: int, max_blocks: int, device: torch.device) -> DecodeBuffers:
        return DecodeBuffers(torch.zeros(size, dtype=torch.long, device=device),
                             torch.zeros(3, size, dtype=torch.long, device=device),
                             torch.zeros(size, dtype=torch.long, device=device),
                             torch.zeros(size, max_blocks, dtype=torch.int32, device=device),
                             torch.ones(size, dtype=torch.int32, device=device))


class StaticDecodeContext:
    """AttentionContext of a static decode batch: write every row's K/V, then paged decode attention.

    `tables` is the buffers' table or its first columns: the torch reference gathers every column it is given,
    so uncaptured steps pass only the blocks the longest row needs (the Triton kernel reads each row's own).
    """

    def __init__(self, cache: KVCache, buffers: DecodeBuffers, tables: Tensor) -> None:
        self.cache, self.buffers, self.tables = cache, buffers, tables

    def attend(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:  # q [B, Hq, d], k/v [B, Hkv, d]
        k_layer, v_layer = self.cache.k[layer_idx], self.cache.v[layer_idx]  # [Hkv, S, d]
        k_layer.index_copy_(1, self.buffers.slots, k.transpose(0, 1))
        v_layer.index_copy_(1, self.buffers.slots, v.transpose(0, 1))
        return K.paged_decode(q, k_layer, v_layer, self.tables, self.buffers.lens, self.cache.block_size)


class DecodeGraphs:
    """Bucketed static decode forwards; CUDA graphs captured lazily, one per bucket, on first use."""

    def __init__(self, model: QwenVLModel, kv: KVCache, scratch_block: int, max_blocks: int, max_num_seqs: int,
                 capture: bool) -> None:
        self.model, self.kv = model, kv
        self.scratch_block, self.max_blocks = scratch_block, max_blocks
        self.sizes = bucket_sizes(max_num_seqs)
        self.capture = capture and model.device.type == "cuda"
        self.buffers: dict[int, DecodeBuffers] = {}
        self.graphs: dict[int, torch.cuda.CUDAGraph | None] = {}  # None: capture failed, run eagerly
        self.pool = None

    def capture_counts(self) -> tuple[int, int]:
        """(buckets captured as CUDA graphs, buckets whose capture failed and that run eagerly)."""
        captured = sum(g is not None for g in self.graphs.values())
        return captured, len(self.graphs) - captured

    @staticmethod
    def accepts(plan: BatchPlan, max_rows: int) -> bool:
        """A pure decode step: every chunk one generated token that samples, nothing else."""
        n = len(plan.chunks)
        return (0 < n <= max_rows and len(plan.generated_rows) == n and not plan.media and not plan.scoring
                and len(plan.sample_rows) == n)

    def run(self, plan: BatchPlan, tables: Tensor, rows: Tensor) -> Tensor:
        """Logits [n, V] float32 of a pure decode plan (see accepts); `rows` [n] of the chunks' block tables in the
        persistent batch's `tables` [R, max_blocks]."""
        n = len(plan.chunks)
        size = next(s for s in self.sizes if s >= n)
        buf = self.buffers.get(size) or self.buffers.setdefault(
            size, DecodeBuffers.allocate(size, self.max_blocks, self.model.device))
        width = self._fill(buf, plan, size, tables, rows)
        graph = None
        if self.capture:
            graph = self.graphs[size] if size in self.graphs else self._capture(size, buf)
        if graph is None:
            self._forward(buf, width)
        else:
            graph.replay()
        return buf.logits[:n]

    def _fill(self, buf: DecodeBuffers, plan: BatchPlan, size: int, tables: Tensor, rows: Tensor) -> int:
        """The plan's ids, positions, slots and lengths (padding rows: token 0 at position 0, the scratch slot), one
        copy each, and its block tables gathered on the device from the persistent rows; returns the number of
        table columns the longest row needs."""
        n, bs = len(plan.chunks), self.kv.block_size
        ids = np.zeros(size, dtype=np.int64)
        ids[:n] = plan.token_ids
        pos = np.zeros(size, dtype=np.int64)
        pos[:n] = plan.generated_positions
        slots = np.full(size, self.scratch_block * bs, dtype=np.int64)
        slots[:n] = plan.single_slots
        lens = np.ones(size, dtype=np.int32)
        lens[:n] = [chunk.end for chunk in plan.chunks]
        for dst, src in ((buf.ids, ids), (buf.positions, np.broadcast_to(pos, (3, size))), (buf.slots, slots),
                         (buf.lens, lens)):
            dst.copy_(torch.from_numpy(np.ascontiguousarray(src)), non_blocking=True)
        torch.index_select(tables, 0, rows, out=buf.tables[:n])
        buf.tables[n:] = self.scratch_block
        return min(-(-int(lens.max()) // bs), self.max_blocks)

    @torch.inference_mode()
    def _forward(self, buf: DecodeBuffers, width: int | None = None) -> None:
        """The bucket's LM + logits; `width` table columns (None: all, as captured graphs do)."""
        tables = buf.tables if width is None else buf.tables[:, :width]
        embeds = self.model.embed_tokens(buf.ids)  # [B, D]
        hidden = self.model.forward_hidden(embeds, buf.positions, StaticDecodeContext(self.kv, buf, tables))
        logits = self.model.compute_logits(hidden)  # [B, V] float32
        if buf.logits is None:
            buf.logits = logits
        else:
            buf.logits.copy_(logits)

    def _capture(self, size: int, buf: DecodeBuffers) -> torch.cuda.CUDAGraph | None:
        """Warm up (compiles kernels, allocates the output), then capture; on failure warn and stay eager."""
        try:
            self._forward(buf)
            torch.cuda.synchronize(self.model.device)
            self.pool = self.pool or torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self._forward(buf)
            self.graphs[size] = graph
        except Exception as exc:  # a capture failure must not stop serving: run this bucket eagerly
            log.warning("CUDA graph capture of decode bucket %d failed (%s: %s); running it eagerly", size,
                        type(exc).__name__, exc)
            self.graphs[size] = None
        return self.graphs[size]
