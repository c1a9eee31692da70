"""ModelRunner: the only place that builds tensors; runs vision (with the encoder cache) and the paged LM step."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from mm_infer.engine.runner.batch_plan import BatchPlan
from mm_infer.engine.runner.decode_graphs import DecodeGraphs
from mm_infer.engine.runner.paged_attention import DecodeGroup, KVCache, PagedAttentionContext, PrefillTables
from mm_infer.engine.runner.persistent_batch import PersistentBatch
from mm_infer.engine.runner.step_threads import StepThreads
from mm_infer.engine.scheduling.encoder_cache import EncoderCache
from mm_infer.engine.scheduling.scheduler import ScheduledChunk
from mm_infer.media.packed import PackedTensor
from mm_infer.models.language import DeepStack
from mm_infer.models.moe import SparseMoE
from mm_infer.models.qwen_vl import QwenVLModel
from mm_infer.models.recurrent_batch import RecurrentBatch, StateSegment
from mm_infer.prompt.mrope import decode_positions
from mm_infer.prompt.request import MediaItem, VLMRequest
from mm_infer_kernels import dispatch as K

# CPU GEMMs give row-invariant results only from this many rows up; pad smaller batches to it.
MIN_ROWS = 16
# Logits (float32 [rows, V]) of one step are made in blocks of rows under this many bytes (prompt logprobs of a
# long prompt score every row of its chunk).
LOGIT_BLOCK_BYTES = 64 << 20


@dataclass(frozen=True)
class StepLimits:
    """The sizes every step fits in, and whether pure decode steps run over static buffers (decode_graphs.py),
    captured as CUDA graphs when `capture` is set."""

    max_model_len: int
    max_num_seqs: int
    static_decode: bool = True
    capture: bool = False
    threads: StepThreads = StepThreads()
    routing_rows: int = 0  # > 0: the MoE layers record each row's experts (R3) for batches of up to this many rows
    state_slots: int = 0  # hybrid models: recurrent-state slots (live + snapshots, engine/scheduling/state_slots.py)


@dataclass
class StepOutput:
    """Logits of sampling chunks (in order) and prompt logprobs gathered this step."""

    sample_chunks: list[ScheduledChunk]
    sample_logits: Tensor  # [S, V] float32
    sample_rows: Tensor  # [S] long: the sampled sequences' rows in the persistent batch (device)
    routing: np.ndarray | None = None  # [N, L, k] the batch's MoE routing, chunk after chunk (R3; None: off)
    # seq_id -> (first scored prompt index, logprob of each actual token, top-k alternatives or None, rank of each
    # actual token: 1 + how many other tokens score at least as high, vLLM's count)
    prompt_logprobs: dict[int, tuple[int, list[float], list[dict[int, float]] | None, list[int]]] = field(
        default_factory=dict)


def _pad_rows(x: Tensor, rows: int) -> Tensor:
    """x [N, ...] -> [max(N, rows), ...] with zero rows appended."""
    if x.shape[0] >= rows:
        return x
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])


class ModelRunner:
    """Holds the model, the KV cache and the encoder cache; turns scheduled chunks into logits."""

    def __init__(self, model: QwenVLModel, num_kv_blocks: int, block_size: int, encoder_cache: EncoderCache,
                 limits: StepLimits, batch_invariant: bool = False) -> None:
        self.model = model
        self.min_rows = MIN_ROWS if batch_invariant else 0  # pad batches to this many rows; media items under it alone
        if batch_invariant and model.device.type != "cuda":  # MoE experts: each group padded to MIN_ROWS too
            for module in model.modules():
                if isinstance(module, SparseMoE) or hasattr(module, "min_group_rows"):
                    module.min_group_rows = MIN_ROWS
        text = model.config.text
        # two more blocks than the block manager hands out: the scratch block that static decode's padding rows
        # write and read, and the zero block, never written, that every padded read of a real row points at
        self.scratch_block, self.zero_block = num_kv_blocks, num_kv_blocks + 1
        self.kv = KVCache.allocate(text.num_layers, num_kv_blocks + 2, block_size, text.num_kv_heads,
                                   text.head_dim, model.dtype, model.device)
        max_blocks = -(-limits.max_model_len // block_size)
        # before any graph is captured: graphs then write the same buffer
        self.routing = model.capture_routing(limits.routing_rows) if limits.routing_rows else None
        self.states = model.state_pool(limits.state_slots) if getattr(model, "has_recurrent_state", False) else None
        self.commit_state = True
        self.batch = PersistentBatch(limits.max_num_seqs, max_blocks, self.zero_block, model.device)
        self.graphs = DecodeGraphs(model, self.kv, self.scratch_block, max_blocks, limits.max_num_seqs,
                                   limits.capture) if limits.static_decode else None
        self.block_size = block_size
        self.threads = limits.threads
        self.encoder_cache = encoder_cache
        self.encoder_calls = 0  # media items run through the vision tower
        self.device = model.device

    def release(self) -> None:
        """Drop every device buffer this runner holds (LLMEngine.close); it cannot run afterwards."""
        self.kv = self.graphs = self.states = self.routing = None  # type: ignore[assignment]
        self.batch = None  # type: ignore[assignment]
        self.model = None  # type: ignore[assignment]

    @staticmethod
    def kv_bytes_per_block(model: QwenVLModel, block_size: int) -> int:
        text = model.config.text
        return 2 * text.num_layers * block_size * text.num_kv_heads * text.head_dim * model.dtype.itemsize

    def encode_items(self, items: list[MediaItem]) -> dict[str, Tensor]:
        """Embeddings [tokens, D] of each distinct item, from the cache or the vision tower.

        All go through the tower together, except under batch_invariant: there items of >= MIN_ROWS tokens go
        together (every matmul then has >= MIN_ROWS rows, where CPU GEMMs are row-invariant) and smaller ones
        alone, so no item's numbers depend on its company.
        """
        found: dict[str, Tensor] = {}
        missing: dict[str, MediaItem] = {}
        for item in items:
            if item.content_hash in found or item.content_hash in missing:
                continue
            emb = self.encoder_cache.get(item.content_hash)
            if emb is None:
                missing[item.content_hash] = item
            else:
                found[item.content_hash] = emb
        merge = self.model.config.vision.spatial_merge_size
        big = [it for it in missing.values() if it.num_tokens(merge) >= self.min_rows]
        batches = [big] if big else []
        batches += [[it] for it in missing.values() if it.num_tokens(merge) < self.min_rows]
        for batch in batches:
            embs = self._encode(batch)  # [sum tokens, D]
            for it, emb in zip(batch, embs.split([it.num_tokens(merge) for it in batch]), strict=True):
                found[it.content_hash] = emb
                self.encoder_cache.put(it.content_hash, emb)
            self.encoder_calls += len(batch)
        return found

    def _encode(self, batch: list[MediaItem]) -> Tensor:
        """The vision tower over items. Items holding uint8 frames go to the device as frames and are embedded
        there (fused Triton patch embed off the CPU; on the CPU, table-lookup rows one group at a time, equal to the
        rows path); rows-form items take the float rows and the patch-embed matmul."""
        if hasattr(self.model, "encode_items"):  # families that encode each kind of item their own way
            return self.model.encode_items(batch)
        frames = PackedTensor.joint_frame_batch([it.media for it in batch])
        if frames is not None:
            return self.model.encode_frames(frames)
        pixels = torch.cat([it.pixel_values for it in batch]) if len(batch) > 1 else batch[0].pixel_values
        return self.model.encode_vision(pixels, [list(it.grid_thw) for it in batch])  # [P, width] rows

    @staticmethod
    def _positions(req: VLMRequest, start: int, end: int) -> Tensor:
        """[3, end-start] M-RoPE positions of sequence indices [start, end) (host tensors)."""
        prompt_len = req.mrope_positions.shape[1]
        parts = []
        if start < prompt_len:
            parts.append(req.mrope_positions[:, start:min(end, prompt_len)])
        if end > prompt_len:
            lo = max(start, prompt_len)
            parts.append(decode_positions(lo, end - lo, req.mrope_delta))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def _block_tables(self, chunks: list[ScheduledChunk], width: int | None = None) -> np.ndarray:
        """[len(chunks), blocks] int64 block ids covering width tokens (or each chunk's context), padded with the
        zero block."""
        nblk = -(-(width or max(c.end for c in chunks)) // self.block_size)
        pad = [self.zero_block]
        tables = [c.seq.block_table[:nblk] + pad * (nblk - min(len(c.seq.block_table), nblk)) for c in chunks]
        return np.asarray(tables, dtype=np.int64)  # [C, nblk]

    def _table_slots(self, chunks: list[ScheduledChunk], width: int | None = None) -> np.ndarray:
        """[len(chunks), blocks * block_size] slots of each chunk's first blocks (width tokens, or its context)."""
        blocks = self._block_tables(chunks, width)  # [C, nblk]
        return (blocks[:, :, None] * self.block_size + np.arange(self.block_size)).reshape(len(chunks), -1)

    def _prefill_tables(self, plan: BatchPlan) -> PrefillTables | None:
        """The paged prefill kernel's metadata, when the KV cache's backend is Triton (else the SDPA loop runs)."""
        if not plan.spans or K.select_backend(self.kv.k) != "triton":
            return None
        tables = self._to_device(self._block_tables(plan.multi).astype(np.int32))  # [C, blocks]
        meta = np.asarray([[s.q_start, s.q_len, s.ctx_len] for s in plan.spans], dtype=np.int64)  # [C, 3]
        return PrefillTables(tables, self._to_device(meta[:, 0]), self._to_device(meta[:, 1]),
                             self._to_device(meta[:, 2]), int(meta[:, 1].max()))

    def _decode_groups(self, chunks: list[ScheduledChunk], rows: list[int]) -> list[DecodeGroup]:
        buckets: dict[int, list[int]] = {}
        for i, c in enumerate(chunks):
            buckets.setdefault(DecodeGroup.bucket(c.end, self.block_size), []).append(i)
        groups = []
        for lpad, members in buckets.items():
            picked = [chunks[i] for i in members]
            slots = self._table_slots(picked, lpad)  # [G, Lpad]
            pad = np.arange(lpad)[None, :] >= np.asarray([c.end for c in picked])[:, None]  # [G, Lpad]
            slots[pad] = self.zero_block * self.block_size  # never a live slot: 0 x NaN is NaN
            groups.append(DecodeGroup(self._to_device([rows[i] for i in members]), self._to_device(slots.reshape(-1)),
                                      self._to_device(pad)))
        return groups

    def _clear_fresh_blocks(self, chunks: list[ScheduledChunk]) -> None:
        """Zero the last block of each chunk that writes that block's first slot: its slots past the chunk still
        hold an earlier owner's KV, which masked reads (whole-block gathers) would multiply by zero, and 0 x NaN
        is NaN. Blocks before it are written whole; one a chunk did not start was cleared by the chunk that did.
        Prefix-cache hits end before a chunk starts, so they are never cleared."""
        bs = self.block_size
        fresh = [c.seq.block_table[(c.end - 1) // bs] for c in chunks if (c.end - 1) // bs * bs >= c.start]
        if fresh:
            self.kv.clear_blocks(self._to_device(fresh))

    def _context_slots(self, chunks: list[ScheduledChunk]) -> np.ndarray:
        """Context slots of multi-token chunks back to back: [sum of their context lengths] int64."""
        if not chunks:
            return np.empty(0, dtype=np.int64)
        slots = self._table_slots(chunks)  # [C, W]
        return np.concatenate([row[:c.end] for row, c in zip(slots, chunks, strict=True)])

    def _to_device(self, host: np.ndarray | list[int]) -> Tensor:
        """Host metadata (numpy or a list of ints) as a device tensor: one host-to-device copy."""
        return torch.from_numpy(np.ascontiguousarray(host, dtype=None if isinstance(host, np.ndarray) else np.int64)
                                ).to(self.device, non_blocking=True)

    def _slot_mapping(self, plan: BatchPlan, ctx_slots: np.ndarray) -> np.ndarray:
        """[N] cache slot of each real token: decode rows from the plan, chunk rows from their context slots."""
        slot_mapping = np.empty(len(plan.token_ids), dtype=np.int64)
        slot_mapping[plan.single_rows] = plan.single_slots
        for sp in plan.spans:
            end = sp.ctx_start + sp.ctx_len
            slot_mapping[sp.q_start:sp.q_start + sp.q_len] = ctx_slots[end - sp.q_len:end]
        return slot_mapping

    def _inputs(self, plan: BatchPlan) -> tuple[Tensor, Tensor, PagedAttentionContext]:
        """Device tensors of a plan: input ids [Np], M-RoPE positions [3, Np] and the paged attention context."""
        ctx_slots = self._context_slots(plan.multi)
        rows = max(len(plan.token_ids), self.min_rows)  # padding rows (batch invariance) hold token 0
        input_ids = np.zeros(rows, dtype=np.int64)
        input_ids[:len(plan.token_ids)] = plan.token_ids
        pos = torch.zeros(3, rows, dtype=torch.long)  # [3, Np], padding rows at 0
        for row, req, start, end in plan.prompt_runs:
            pos[:, row:row + end - start] = self._positions(req, start, end)
        if plan.generated_rows:
            pos[:, plan.generated_rows] = torch.tensor(plan.generated_positions, dtype=torch.long)  # same on t, h, w
        groups = self._decode_groups(plan.singles, plan.single_rows)
        attn = PagedAttentionContext(self.kv, self._to_device(self._slot_mapping(plan, ctx_slots)),
                                     self._to_device(ctx_slots), plan.spans, groups, self._prefill_tables(plan),
                                     self.min_rows)
        return self._to_device(input_ids), pos.to(self.device, non_blocking=True), attn

    def _embed(self, plan: BatchPlan, input_ids: Tensor) -> tuple[Tensor, DeepStack | None]:
        """Token embeddings [Np, D] with each media slice's vision embeddings written over its pad rows, and
        the DeepStack features of those rows (Qwen3-VL; None for the others)."""
        embeds = self.model.embed_tokens(input_ids)  # [Np, D]
        if not plan.media:
            return embeds, None
        vision = self.encode_items([m.item for m in plan.media])
        rows = np.concatenate([np.arange(m.row, m.row + m.count) for m in plan.media])  # [K]
        features = torch.cat([vision[m.item.content_hash][m.first:m.first + m.count] for m in plan.media])  # [K, W]
        return self.model.embed_media(embeds, self._to_device(rows), features)

    def _logit_blocks(self, hidden: Tensor, picked: list[int], first: int) -> Iterator[tuple[int, Tensor]]:
        """(first picked index, float32 logits [b, V]) of consecutive blocks of the picked rows of hidden [Np, D].

        The first block holds at least `first` rows (the sampled ones); every block is as long as LOGIT_BLOCK_BYTES
        allows (at least MIN_ROWS), so prompt scoring's peak is linear in the prompt. A step that fits is one block:
        one GEMM, as it always was. Later blocks are padded to MIN_ROWS, where rows do not depend on the row count."""
        vocab = self.model.config.text.vocab_size
        block = max(first, LOGIT_BLOCK_BYTES // (vocab * 4), MIN_ROWS)
        for lo in range(0, max(len(picked), 1), block):  # no rows: one empty block, [0, V] logits
            rows = self._to_device(picked[lo:lo + block])  # [b]
            pad = self.min_rows if lo == 0 else MIN_ROWS
            yield lo, self.model.compute_logits(_pad_rows(hidden[rows], pad))[:rows.shape[0]]  # [b, V]

    @staticmethod
    def _score_rows(logits: Tensor, targets: list[int], k: int | None) -> tuple[list[float], list[dict[int, float]]
                                                                                 | None, list[int]]:
        """Own logprob, top-k alternatives and rank of each target token under its row of logits [c, V]."""
        lps = torch.log_softmax(logits, dim=-1)  # [c, V]
        tops = None
        if k:
            values, idx = torch.topk(lps, k, dim=-1)  # [c, k]
            tops = [dict(zip(i, v, strict=True)) for i, v in zip(idx.tolist(), values.tolist(), strict=True)]
        own = lps.gather(1, torch.tensor(targets, device=lps.device)[:, None])  # [c, 1]
        ranks = (lps >= own).sum(dim=-1)  # [c]: the token itself counts, so the most likely has rank 1
        return own[:, 0].tolist(), tops, ranks.tolist()

    def _score_block(self, plan: BatchPlan, lo: int, logits: Tensor, out: StepOutput) -> None:
        """Prompt logprobs of the score rows among picked rows [lo, lo + len(logits)) (sample rows come first)."""
        row = len(plan.sample_rows)  # picked index of the current scoring's first row
        hi = lo + logits.shape[0]
        for s in plan.scoring:
            a, b = max(row, lo), min(row + s.count, hi)
            if a < b:
                seq = s.chunk.seq
                first = s.first_target + a - row
                own, tops, ranks = self._score_rows(logits[a - lo:b - lo], seq.token_ids[first:first + b - a],
                                                    seq.params.prompt_logprobs)
                got = out.prompt_logprobs.setdefault(seq.seq_id, (s.first_target, [], None if tops is None else [], []))
                got[1].extend(own)
                got[3].extend(ranks)
                if got[2] is not None and tops is not None:
                    got[2].extend(tops)
            row += s.count

    def _recurrent(self, plan: BatchPlan) -> RecurrentBatch:
        """Each chunk's recurrent-state segment: read its own slot (a prefix hit's snapshot first; nothing at the
        start), write its own slot, and keep the state at its pending snapshot position when the chunk crosses it."""
        assert self.states is not None
        segments, row = [], 0
        for c in plan.chunks:
            seq = c.seq
            read = None if c.start == 0 else seq.restore_slot if seq.restore_slot is not None else seq.state_slot
            keep = tuple(p for p in seq.pending_snapshots if c.start < p[0] <= c.end)
            segments.append(StateSegment(row, c.start, c.num_tokens, seq.num_prompt_tokens, read, seq.state_slot,
                                         keep, seq.state_boundaries(self.block_size)))
            row += c.num_tokens
        return RecurrentBatch(self.states, segments, invariant=self.min_rows > 0)

    @contextmanager
    def states_frozen(self) -> Iterator[None]:
        """Runs inside write no recurrent state back (fault isolation's reruns: the step is scheduled again)."""
        self.commit_state = False
        try:
            yield
        finally:
            self.commit_state = True

    @torch.inference_mode()
    def run(self, chunks: list[ScheduledChunk]) -> StepOutput:
        """One forward over the scheduled chunks: plan, tensors, embeddings, LM, logits of the rows that need them.

        Pure decode steps take the static path (CUDA graphs on CUDA) when the runner has one. A hybrid model's
        advanced recurrent states are written back only once all of it succeeded (and not inside states_frozen)."""
        plan = BatchPlan.build(chunks, self.block_size)
        self._clear_fresh_blocks(chunks)
        sample_chunks = plan.sample_chunks
        rows = self.batch.rows_of([c.seq for c in sample_chunks])  # [S]
        if self.graphs is not None and DecodeGraphs.accepts(plan, self.graphs.sizes[-1]):
            logits = self.graphs.run(plan, self.batch.tables, rows)
            return StepOutput(sample_chunks, logits, rows, self._routing(plan))
        with self.threads.for_plan(plan):
            input_ids, positions, attn = self._inputs(plan)
            attn.recurrent = self._recurrent(plan) if self.states is not None else None
            embeds, deepstack = self._embed(plan, input_ids)
            hidden = self.model.forward_hidden(embeds, positions, attn, deepstack)  # [Np, D]
            blocks = self._logit_blocks(hidden, plan.sample_rows + plan.score_rows, len(plan.sample_rows))
            lo, logits = next(blocks)  # the block of the sampled rows (of no rows, when none samples or scores)
            out = StepOutput(sample_chunks, logits[:len(plan.sample_rows)], rows)
            self._score_block(plan, lo, logits, out)
            for lo, logits in blocks:
                self._score_block(plan, lo, logits, out)
            if attn.recurrent is not None and self.commit_state:
                attn.recurrent.commit()
        out.routing = self._routing(plan)
        return out

    def _routing(self, plan: BatchPlan) -> np.ndarray | None:
        """The step's routing rows for the plan's tokens (padding rows left out), or None when not recorded."""
        return None if self.routing is None else self.routing.take(len(plan.token_ids))
