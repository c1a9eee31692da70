"""ModelRunner: the only place that builds tensors; runs vision (with the encoder cache) and the paged LM step."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from mm_infer.engine.encoder_cache import EncoderCache
from mm_infer.engine.paged_attention import KVCache, PagedAttentionContext, SeqSpan
from mm_infer.engine.request import MediaItem, VLMRequest
from mm_infer.engine.scheduler import ScheduledChunk
from mm_infer.models.qwen2_vl import QwenVLModel
from mm_infer.prompt.mrope import decode_positions

# CPU GEMMs give row-invariant results only from this many rows up; pad smaller batches to it.
MIN_ROWS = 16


@dataclass
class StepOutput:
    """Logits of sampling chunks (in order) and prompt logprobs gathered this step."""

    sample_chunks: list[ScheduledChunk]
    sample_logits: Tensor  # [S, V] float32
    prompt_logprobs: dict[int, tuple[int, list[float]]] = field(default_factory=dict)  # seq_id -> (first, lps)


def _pad_rows(x: Tensor, rows: int) -> Tensor:
    """x [N, ...] -> [max(N, rows), ...] with zero rows appended."""
    if x.shape[0] >= rows:
        return x
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])


class ModelRunner:
    """Holds the model, the KV cache and the encoder cache; turns scheduled chunks into logits."""

    def __init__(self, model: QwenVLModel, num_kv_blocks: int, block_size: int, encoder_cache: EncoderCache) -> None:
        self.model = model
        text = model.config.text
        self.kv = KVCache.allocate(text.num_layers, num_kv_blocks, block_size, text.num_kv_heads, text.head_dim,
                                   model.dtype, model.device)
        self.block_size = block_size
        self.encoder_cache = encoder_cache
        self.encoder_calls = 0  # media items run through the vision tower
        self.device = model.device

    @staticmethod
    def kv_bytes_per_block(model: QwenVLModel, block_size: int) -> int:
        text = model.config.text
        return 2 * text.num_layers * block_size * text.num_kv_heads * text.head_dim * model.dtype.itemsize

    def item_embeddings(self, item: MediaItem) -> Tensor:
        """[t*h*w/merge², D] for one item, from the cache or the vision tower (one item per call: batch-invariant)."""
        emb = self.encoder_cache.get(item.content_hash)
        if emb is None:
            grid = torch.tensor([item.grid_thw], dtype=torch.long)
            emb = self.model.encode_vision(item.pixel_values, grid)
            self.encoder_calls += 1
            self.encoder_cache.put(item.content_hash, emb)
        return emb

    def _positions(self, req: VLMRequest, start: int, end: int) -> Tensor:
        """[3, end-start] M-RoPE positions of sequence indices [start, end)."""
        prompt_len = req.mrope_positions.shape[1]
        parts = []
        if start < prompt_len:
            parts.append(req.mrope_positions[:, start:min(end, prompt_len)])
        if end > prompt_len:
            lo = max(start, prompt_len)
            parts.append(decode_positions(lo, end - lo, req.mrope_delta))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    @torch.inference_mode()
    def run(self, chunks: list[ScheduledChunk]) -> StepOutput:
        ids: list[int] = []
        positions: list[Tensor] = []
        slot_maps: list[Tensor] = []
        spans: list[SeqSpan] = []
        media_rows: list[Tensor] = []
        media_embs: list[Tensor] = []
        sample_rows: list[int] = []
        score_rows: list[int] = []  # rows whose logits score the next prompt token
        prompt_rows: list[tuple[ScheduledChunk, int, int]] = []  # chunk, first target index, rows
        bs = self.block_size
        for chunk in chunks:
            seq, base = chunk.seq, len(ids)
            req: VLMRequest = seq.group.payload
            ids.extend(seq.token_ids[chunk.start:chunk.end])
            positions.append(self._positions(req, chunk.start, chunk.end))
            table = torch.tensor(seq.block_table, dtype=torch.long)
            ctx_slots = (table[:, None] * bs + torch.arange(bs)).reshape(-1)[:chunk.end]  # [ctx]
            slot_maps.append(ctx_slots[chunk.start:])
            spans.append(SeqSpan(base, chunk.num_tokens, ctx_slots))
            for r in seq.items_in(chunk.start, chunk.end):
                lo, hi = max(chunk.start, r.offset), min(chunk.end, r.end)
                media_rows.append(torch.arange(base + lo - chunk.start, base + hi - chunk.start))
                media_embs.append(self.item_embeddings(req.items[r.item_index])[lo - r.offset:hi - r.offset])
            if chunk.samples:
                sample_rows.append(base + chunk.num_tokens - 1)
            if seq.params.prompt_logprobs is not None:
                first = max(chunk.start, len(seq.prompt_logprobs) - 1, 0)  # positions already scored are skipped
                last = min(chunk.end, seq.num_prompt_tokens - 1)
                if last > first:
                    prompt_rows.append((chunk, first + 1, last - first))
                    score_rows.extend(range(base + first - chunk.start, base + last - chunk.start))
        n = len(ids)
        input_ids = _pad_rows(torch.tensor(ids, dtype=torch.long), MIN_ROWS).to(self.device)  # [Np]
        embeds = self.model.embed_tokens(input_ids)  # [Np, D]
        if media_rows:
            embeds.index_copy_(0, torch.cat(media_rows).to(self.device), torch.cat(media_embs).to(embeds.dtype))
        pos = torch.cat(positions, dim=1)  # [3, N]
        pos = torch.cat([pos, pos.new_zeros(3, input_ids.shape[0] - n)], dim=1)  # [3, Np]
        ctx = PagedAttentionContext(self.kv, torch.cat(slot_maps).to(self.device),
                                    [SeqSpan(s.q_start, s.q_len, s.ctx_slots.to(self.device)) for s in spans])
        hidden = self.model.forward_hidden(embeds, pos.to(self.device), ctx)  # [Np, D]
        rows = torch.tensor(sample_rows + score_rows, dtype=torch.long, device=self.device)
        logits = self.model.compute_logits(_pad_rows(hidden[rows], MIN_ROWS))[:rows.shape[0]]  # [R, V] float32
        sample_chunks = [c for c in chunks if c.samples]
        out = StepOutput(sample_chunks, logits[:len(sample_chunks)])
        if prompt_rows:
            row = len(sample_chunks)
            for chunk, first_target, count in prompt_rows:
                lps = torch.log_softmax(logits[row:row + count], dim=-1)  # [count, V]
                targets = torch.tensor(chunk.seq.token_ids[first_target:first_target + count], device=lps.device)
                out.prompt_logprobs[chunk.seq.seq_id] = (first_target, lps.gather(1, targets[:, None])[:, 0].tolist())
                row += count
        return out
