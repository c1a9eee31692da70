"""BatchPlan: where each scheduled chunk's tokens, cache slots, media and sampled rows sit in one flat batch."""

from __future__ import annotations

from dataclasses import dataclass, field

from mm_infer.engine.runner.paged_attention import SeqSpan
from mm_infer.engine.scheduling.scheduler import ScheduledChunk
from mm_infer.prompt.request import MediaItem, VLMRequest


@dataclass(frozen=True)
class MediaSlice:
    """Tokens [first, first+count) of a media item's embeddings go to batch rows [row, row+count)."""

    row: int
    first: int
    count: int
    item: MediaItem


@dataclass(frozen=True)
class PromptScoring:
    """Rows that score prompt tokens [first_target, first_target+count) of a chunk's sequence."""

    chunk: ScheduledChunk
    first_target: int
    count: int


@dataclass
class BatchPlan:
    """Plain-Python layout of one step's batch (no tensors): the model runner turns it into device tensors."""

    chunks: list[ScheduledChunk]
    token_ids: list[int] = field(default_factory=list)  # [N] the batch's tokens, chunk after chunk
    single_rows: list[int] = field(default_factory=list)  # rows of one-token chunks (paged decode attention)
    single_slots: list[int] = field(default_factory=list)  # their cache slots
    # attention: one-token chunks (above) use paged decode attention, multi-token chunks (spans) prefill attention
    spans: list[SeqSpan] = field(default_factory=list)  # multi-token chunks (prefill attention)
    multi: list[ScheduledChunk] = field(default_factory=list)  # the chunks of `spans`, same order
    # positions: rows inside a prompt take its M-RoPE positions, rows past it plain text positions
    prompt_runs: list[tuple[int, VLMRequest, int, int]] = field(default_factory=list)  # (row, request, start, end)
    generated_rows: list[int] = field(default_factory=list)  # one-token rows past the prompt
    generated_positions: list[int] = field(default_factory=list)  # their position (same on t, h, w)
    media: list[MediaSlice] = field(default_factory=list)
    sample_rows: list[int] = field(default_factory=list)  # last row of each chunk that samples
    score_rows: list[int] = field(default_factory=list)  # rows whose logits score the next prompt token
    scoring: list[PromptScoring] = field(default_factory=list)

    @property
    def singles(self) -> list[ScheduledChunk]:
        return [c for c in self.chunks if c.num_tokens == 1]

    @property
    def sample_chunks(self) -> list[ScheduledChunk]:
        return [c for c in self.chunks if c.samples]

    @staticmethod
    def build(chunks: list[ScheduledChunk], block_size: int) -> BatchPlan:
        plan = BatchPlan(chunks)
        ctx_offset = 0  # multi-token chunks' contexts are laid out back to back
        for chunk in chunks:
            row = len(plan.token_ids)
            plan.token_ids.extend(chunk.seq.token_ids[chunk.start:chunk.end])
            if chunk.num_tokens == 1:
                plan.single_rows.append(row)
                seq = chunk.seq
                plan.single_slots.append(seq.block_table[chunk.start // block_size] * block_size
                                         + chunk.start % block_size)
            else:
                plan.spans.append(SeqSpan(row, chunk.num_tokens, ctx_offset, chunk.end))
                plan.multi.append(chunk)
                ctx_offset += chunk.end
            plan._place(chunk, row)
        return plan

    def _place(self, chunk: ScheduledChunk, row: int) -> None:
        """Positions, media, sampled and scored rows of one chunk starting at batch row `row`."""
        seq = chunk.seq
        req = seq.group.request
        if chunk.num_tokens == 1 and chunk.start >= seq.num_prompt_tokens:
            self.generated_rows.append(row)
            self.generated_positions.append(chunk.start + req.mrope_delta)
        else:
            self.prompt_runs.append((row, req, chunk.start, chunk.end))
        for r in seq.items_in(chunk.start, chunk.end):
            lo, hi = max(chunk.start, r.offset), min(chunk.end, r.end)
            self.media.append(MediaSlice(row + lo - chunk.start, lo - r.offset + r.item_offset, hi - lo,
                                         req.items[r.item_index]))
        if chunk.samples:
            self.sample_rows.append(row + chunk.num_tokens - 1)
        if seq.params.prompt_logprobs is not None:
            first = max(chunk.start, len(seq.prompt_logprobs) - 1, 0)  # positions already scored are skipped
            last = min(chunk.end, seq.num_prompt_tokens - 1)
            if last > first:
                self.scoring.append(PromptScoring(chunk, first + 1, last - first))
                self.score_rows.extend(range(row + first - chunk.start, row + last - chunk.start))
