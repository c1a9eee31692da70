"""ModelRunner: the only place that builds tensors; runs vision (with the encoder cache) and the paged LM step."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from mm_infer.engine.encoder_cache import EncoderCache
from mm_infer.engine.paged_attention import DecodeGroup, KVCache, PagedAttentionContext, SeqSpan
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
    # seq_id -> (first scored prompt index, logprob of each actual token, top-k alternatives or None)
    prompt_logprobs: dict[int, tuple[int, list[float], list[dict[int, float]] | None]] = field(default_factory=dict)


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

    def encode_items(self, items: list[MediaItem]) -> dict[str, Tensor]:
        """Embeddings [tokens, D] of each distinct item, from the cache or the vision tower.

        Items of >= MIN_ROWS tokens go through the tower together (every matmul then has >= MIN_ROWS rows,
        where CPU GEMMs are row-invariant); smaller ones alone, so no item's numbers depend on its company.
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
        merge2 = self.model.config.vision.spatial_merge_size ** 2
        big = [it for it in missing.values() if it.pixel_values.shape[0] // merge2 >= MIN_ROWS]
        batches = [big] if big else []
        batches += [[it] for it in missing.values() if it.pixel_values.shape[0] // merge2 < MIN_ROWS]
        for batch in batches:
            grid = torch.tensor([it.grid_thw for it in batch], dtype=torch.long)  # [M, 3]
            pixels = torch.cat([it.pixel_values for it in batch]) if len(batch) > 1 else batch[0].pixel_values
            embs = self.model.encode_vision(pixels, grid)  # [sum tokens, D]
            for it, emb in zip(batch, embs.split([it.pixel_values.shape[0] // merge2 for it in batch]), strict=True):
                found[it.content_hash] = emb
                self.encoder_cache.put(it.content_hash, emb)
            self.encoder_calls += len(batch)
        return found

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

    def _table_slots(self, chunks: list[ScheduledChunk], width: int | None = None) -> Tensor:
        """[len(chunks), blocks * block_size] slots of each chunk's first blocks (width tokens, or its context)."""
        bs = self.block_size
        nblk = -(-(width or max(c.end for c in chunks)) // bs)
        tables = [c.seq.block_table[:nblk] + [0] * (nblk - min(len(c.seq.block_table), nblk)) for c in chunks]
        blocks = torch.tensor(tables, dtype=torch.long)  # [C, nblk]
        return (blocks[:, :, None] * bs + torch.arange(bs)).reshape(len(chunks), -1)

    def _decode_groups(self, chunks: list[ScheduledChunk], rows: list[int]) -> list[DecodeGroup]:
        buckets: dict[int, list[int]] = {}
        for i, c in enumerate(chunks):
            buckets.setdefault(DecodeGroup.bucket(c.end, self.block_size), []).append(i)
        groups = []
        for lpad, members in buckets.items():
            picked = [chunks[i] for i in members]
            slots = self._table_slots(picked, lpad)  # [G, Lpad]
            pad = torch.arange(lpad)[None, :] >= torch.tensor([c.end for c in picked])[:, None]  # [G, Lpad]
            groups.append(DecodeGroup(torch.tensor([rows[i] for i in members], device=self.device),
                                      slots.masked_fill(pad, 0).reshape(-1).to(self.device), pad.to(self.device)))
        return groups

    def _chunk_slots(self, chunks: list[ScheduledChunk]) -> tuple[Tensor, list[int]]:
        """Context slots of multi-token chunks back to back ([sum ctx], long) and each one's offset."""
        if not chunks:
            return torch.empty(0, dtype=torch.long), []
        slots = self._table_slots(chunks)  # [C, W]
        ctx = torch.tensor([c.end for c in chunks])
        keep = torch.arange(slots.shape[1])[None, :] < ctx[:, None]  # [C, W]
        return slots[keep], (torch.cumsum(ctx, 0) - ctx).tolist()

    @torch.inference_mode()
    def run(self, chunks: list[ScheduledChunk]) -> StepOutput:
        single = [c.num_tokens == 1 for c in chunks]
        ctx_slots, ctx_offsets = self._chunk_slots([c for c, one in zip(chunks, single, strict=True) if not one])
        offsets = iter(ctx_offsets)
        ids: list[int] = []
        single_slots: list[int] = []
        spans: list[SeqSpan] = []
        single_rows: list[int] = []
        prefill: list[tuple[int, Tensor]] = []  # (first row, positions [3, n]) of chunks inside the prompt
        decode_rows: list[int] = []
        decode_pos: list[int] = []
        media: list[tuple[int, int, int, MediaItem]] = []  # (first row, first item token, count, item)
        sample_rows: list[int] = []
        score_rows: list[int] = []  # rows whose logits score the next prompt token
        prompt_rows: list[tuple[ScheduledChunk, int, int]] = []  # chunk, first target index, rows
        bs = self.block_size
        for chunk, one in zip(chunks, single, strict=True):
            seq, base = chunk.seq, len(ids)
            req: VLMRequest = seq.group.payload
            ids.extend(seq.token_ids[chunk.start:chunk.end])
            if one:
                single_rows.append(base)
                single_slots.append(seq.block_table[chunk.start // bs] * bs + chunk.start % bs)
            else:
                spans.append(SeqSpan(base, chunk.num_tokens, next(offsets), chunk.end))
            if chunk.num_tokens == 1 and chunk.start >= seq.num_prompt_tokens:
                decode_rows.append(base)
                decode_pos.append(chunk.start + req.mrope_delta)
            else:
                prefill.append((base, self._positions(req, chunk.start, chunk.end)))
            for r in seq.items_in(chunk.start, chunk.end):
                lo, hi = max(chunk.start, r.offset), min(chunk.end, r.end)
                media.append((base + lo - chunk.start, lo - r.offset, hi - lo, req.items[r.item_index]))
            if chunk.samples:
                sample_rows.append(base + chunk.num_tokens - 1)
            if seq.params.prompt_logprobs is not None:
                first = max(chunk.start, len(seq.prompt_logprobs) - 1, 0)  # positions already scored are skipped
                last = min(chunk.end, seq.num_prompt_tokens - 1)
                if last > first:
                    prompt_rows.append((chunk, first + 1, last - first))
                    score_rows.extend(range(base + first - chunk.start, base + last - chunk.start))
        slot_mapping = torch.empty(len(ids), dtype=torch.long)  # [N] cache slot of each token
        slot_mapping[single_rows] = torch.tensor(single_slots, dtype=torch.long)
        for sp in spans:
            slot_mapping[sp.q_start:sp.q_start + sp.q_len] = ctx_slots[sp.ctx_start + sp.ctx_len - sp.q_len:
                                                                       sp.ctx_start + sp.ctx_len]
        input_ids = _pad_rows(torch.tensor(ids, dtype=torch.long), MIN_ROWS)  # [Np]
        pos = torch.zeros(3, input_ids.shape[0], dtype=torch.long)  # [3, Np], padding rows at 0
        for row, p in prefill:
            pos[:, row:row + p.shape[1]] = p
        if decode_rows:
            pos[:, decode_rows] = torch.tensor(decode_pos, dtype=torch.long)  # text positions: same on t, h, w
        embeds = self.model.embed_tokens(input_ids.to(self.device))  # [Np, D]
        if media:
            vision = self.encode_items([m[3] for m in media])
            for row, first, count, item in media:
                embeds[row:row + count] = vision[item.content_hash][first:first + count]
        groups = self._decode_groups([c for c, one in zip(chunks, single, strict=True) if one], single_rows)
        ctx = PagedAttentionContext(self.kv, slot_mapping.to(self.device),
                                    ctx_slots.to(self.device), spans, groups)
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
                k = chunk.seq.params.prompt_logprobs
                tops = None
                if k:
                    values, idx = torch.topk(lps, k, dim=-1)  # [count, k]
                    tops = [dict(zip(i, v, strict=True)) for i, v in zip(idx.tolist(), values.tolist(), strict=True)]
                own = lps.gather(1, targets[:, None])[:, 0].tolist()
                out.prompt_logprobs[chunk.seq.seq_id] = (first_target, own, tops)
                row += count
        return out
