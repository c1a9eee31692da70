"""Scheduler: continuous batching with chunked prefill, token and encoder budgets, preemption by recompute."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mm_infer.config import SchedulerConfig
from mm_infer.engine.scheduling.block_manager import BlockManager
from mm_infer.engine.scheduling.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledChunk:
    """Tokens [start, end) of seq run this step; `samples` when the chunk reaches the last token."""

    seq: Sequence
    start: int
    num_tokens: int
    end: int = field(init=False)
    samples: bool = field(init=False)

    def __post_init__(self) -> None:
        self.end = self.start + self.num_tokens
        self.samples = self.end == len(self.seq)


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)


class Scheduler:
    """Decides which token chunks run each step; owns the waiting and running queues and the blocks."""

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager,
                 encoder_cached: Callable[[str], bool] = lambda _h: False) -> None:
        self.config = config
        self.block_manager = block_manager
        self.encoder_cached = encoder_cached
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.scan_chunk = 0  # hybrid models under batch invariance: prompt chunks end on the scan's own grid

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def has_runnable(self) -> bool:
        """A step could make progress: something waits, or runs without being held back (held ones are only
        skipped while running; a preempted one is recomputed as usual)."""
        return bool(self.waiting) or any(not s.group.held for s in self.running)

    def live_sequences(self) -> list[Sequence]:
        return [*self.running, *self.waiting]

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        enc_budget = [self.config.max_encoder_tokens_per_step]
        planned: set[str] = set()
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.group.held:  # its reader is behind: it keeps its blocks and waits
                i += 1
                continue
            n = self._prefill_cap(seq, min(seq.num_pending_tokens, budget))
            if seq.num_computed_tokens < seq.num_prompt_tokens:  # media only lives in the prompt
                n = self._clip(seq, n, enc_budget, planned)
            if n == 0:
                i += 1
                continue
            while not self.block_manager.allocate(seq, seq.num_computed_tokens + n):
                victim = self.running.pop()
                self._preempt(victim, out)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break
            out.chunks.append(self._with_snapshot(ScheduledChunk(seq, seq.num_computed_tokens, n)))
            budget -= n
            i += 1
        if not out.preempted:
            self._admit(out, budget, enc_budget, planned)
        return out

    def _admit(self, out: SchedulerOutput, budget: int, enc_budget: list[int], planned: set[str]) -> None:
        skipped: list[Sequence] = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting.popleft()
            if self._sibling_prefilling(seq):  # wait one step, then hit the sibling's prompt blocks
                skipped.append(seq)
                continue
            if seq.params.prompt_logprobs is None or len(seq.prompt_logprobs) == seq.num_prompt_tokens:
                self.block_manager.match_prefix(seq)
            n = self._clip(seq, self._prefill_cap(seq, min(seq.num_pending_tokens, budget)), enc_budget, planned)
            if n == 0 or not self.block_manager.allocate(seq, seq.num_computed_tokens + n):
                self.block_manager.free(seq)
                self.waiting.appendleft(seq)
                break
            seq.status = SequenceStatus.RUNNING
            self.block_manager.stats.queries += len(seq)
            self.block_manager.stats.hits += seq.num_computed_tokens
            self.running.append(seq)
            out.chunks.append(self._with_snapshot(ScheduledChunk(seq, seq.num_computed_tokens, n)))
            budget -= n
        self.waiting.extendleft(reversed(skipped))

    def _with_snapshot(self, chunk: ScheduledChunk) -> ScheduledChunk:
        """Hybrid models: a chunk that crosses its prompt's state boundaries (the last full block before each media
        item ends and before the prompt's last token) keeps the recurrent state there (seq.pending_snapshots), so
        that the prompt's other samples and later requests sharing a prefix hit it."""
        seq, bm = chunk.seq, self.block_manager
        if bm.states is None or not bm.enable_prefix_caching:
            return chunk
        bs = bm.block_size
        pending = {pos for pos, _ in seq.pending_snapshots}
        for at in seq.state_boundaries(bs):
            if not chunk.start < at <= chunk.end or at in pending:
                continue
            cached = bm.hash_to_block.get(seq.block_hash(at // bs - 1, bs))
            if cached is not None and bm.blocks[cached].state_slot is not None:
                continue  # this prefix has its snapshot already
            slot = bm.take_snapshot_slot()
            if slot is not None:
                seq.pending_snapshots.append((at, slot))
        return chunk

    def _prefill_cap(self, seq: Sequence, n: int) -> int:
        """A prompt chunk of at most long_prefill_token_threshold tokens (when set); decode steps are never cut."""
        cap = self.config.long_prefill_token_threshold
        if cap and seq.num_computed_tokens < seq.num_prompt_tokens:
            n = min(n, cap)
        return self._on_scan_grid(seq, n) if self.scan_chunk else n

    def _on_scan_grid(self, seq: Sequence, n: int) -> int:
        """A hybrid prompt chunk that stops inside the prompt ends where the sequence's own scan chunks end: at its
        state boundary or a whole number of scan chunks past 0 or past the last boundary, so that the scan's numbers
        never depend on the budget the batch left it (batch invariance). Never less than one grid step's progress
        when the budget allows none (then the chunk is as given)."""
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
        if end >= seq.num_prompt_tokens or start >= seq.num_prompt_tokens:
            return n
        boundaries = seq.state_boundaries(self.block_manager.block_size)
        ahead = [b for b in boundaries if start < b <= end]
        if ahead:
            return ahead[0] - start
        base = max([b for b in boundaries if b <= start], default=0)
        aligned = base + (end - base) // self.scan_chunk * self.scan_chunk
        return aligned - start if aligned > start else n

    def _sibling_prefilling(self, seq: Sequence) -> bool:
        """A sibling is still computing prompt blocks that seq could reuse from the prefix cache next step."""
        if not self.block_manager.enable_prefix_caching or seq.num_output_tokens:
            return False
        bs = self.block_manager.block_size
        shareable = (seq.num_prompt_tokens - 1) // bs * bs
        return any(s is not seq and s.status is SequenceStatus.RUNNING and s.num_computed_tokens < shareable
                   for s in seq.group.seqs)

    def _clip(self, seq: Sequence, n: int, enc_budget: list[int], planned: set[str]) -> int:
        """Shorten the chunk so that vision items not yet encoded fit the encoder budget.

        An item larger than the whole budget still runs when it is the first encoder work of the step.
        """
        start = seq.num_computed_tokens
        for r in seq.items_in(start, start + n):
            if r.content_hash in planned or self.encoder_cached(r.content_hash):
                continue
            cost = seq.group.item_patches[r.item_index]
            fresh = enc_budget[0] == self.config.max_encoder_tokens_per_step
            if cost > enc_budget[0] and not fresh:
                return max(r.offset - start, 0)
            enc_budget[0] -= cost
            planned.add(r.content_hash)
        return n

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        out.chunks = [c for c in out.chunks if c.seq is not seq]

    def update(self, out: SchedulerOutput, routing: np.ndarray | None = None) -> None:
        """Advance progress after the model ran the chunks, and publish newly full blocks to the cache. routing
        [N, L, k]: the step's MoE routing, chunk after chunk, kept by the sequences that record it (R3)."""
        row = 0
        for chunk in out.chunks:
            if routing is not None and chunk.seq.routing is not None:
                chunk.seq.routing.put(chunk.start, routing[row:row + chunk.num_tokens])
            row += chunk.num_tokens
            chunk.seq.num_computed_tokens = chunk.end
            chunk.seq.restore_slot = None  # its state now lives in its own slot
            self.block_manager.commit(chunk.seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Mark seq finished (any queue) and return its blocks."""
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
