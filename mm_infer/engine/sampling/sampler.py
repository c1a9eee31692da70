"""Sampler: batched logits processing and counter-based seeded draws on the logits' device, one readback per step."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch
from torch import Tensor

from mm_infer.engine.runner.persistent_batch import PersistentBatch
from mm_infer.engine.sampling.batch import SamplingBatch
from mm_infer.engine.sampling.logits_processors import (
    apply_grammar,
    apply_penalties,
    apply_temperature,
    mask_tokens,
    truncate,
)
from mm_infer.engine.sampling.random_draws import uniforms
from mm_infer.engine.scheduling.sequence import Sequence


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[float]  # of the sampled token, per logprobs_mode
    top_logprobs: list[dict[int, float] | None]
    nonfinite: list[int]  # per row: 0 fine, RAW_NONFINITE (the model's logits), PROCESSED_NONFINITE (after params)


@dataclass
class SampledTokens:
    """One step's samples, still on the device."""

    batch: SamplingBatch
    token_ids: Tensor  # [S] long
    logprobs: Tensor  # [S] float32, per row's logprobs_mode
    top_values: Tensor  # [S, K] float32, K = the largest `logprobs` asked for (0 columns if none)
    top_ids: Tensor  # [S, K] long
    nonfinite: Tensor  # [S] long: 0, RAW_NONFINITE or PROCESSED_NONFINITE

    def readback(self) -> SampleResult:
        """The one host sync of a step (packed on accelerators; on the CPU there is no sync to save)."""
        k = self.top_values.shape[1]
        bad, ids, lps, top_ids, top_values = self.listed() if self.token_ids.device.type == "cpu" else self.packed()
        tops: list[dict[int, float] | None] = []
        for i, seq in enumerate(self.batch.seqs):
            want = seq.params.logprobs or 0
            row = slice(i * k, i * k + want)
            tops.append({int(t): v for t, v in zip(top_ids[row], top_values[row], strict=True)} if want else None)
        return SampleResult(ids, lps, tops, bad)

    def listed(self) -> tuple[list, list, list, list, list]:
        """nonfinite, token ids, logprobs, top ids, top values as lists, each tensor listed as it is."""
        return (self.nonfinite.tolist(), self.token_ids.tolist(), self.logprobs.tolist(),
                self.top_ids.reshape(-1).tolist(), self.top_values.reshape(-1).tolist())

    def packed(self) -> tuple[list, list, list, list, list]:
        """The same lists from one float64 tensor, one device-to-host copy (exact for ids and float32 values)."""
        s, k = self.top_values.shape
        packed = torch.cat([self.nonfinite.double(), self.token_ids.double(), self.logprobs.double(),
                            self.top_ids.double().reshape(-1), self.top_values.double().reshape(-1)]).tolist()
        bad, ids = [int(b) for b in packed[:s]], [int(t) for t in packed[s:2 * s]]
        top_ids = [int(t) for t in packed[3 * s:3 * s + s * k]]
        return bad, ids, packed[2 * s:3 * s], top_ids, packed[3 * s + s * k:]


RAW_NONFINITE = 1
PROCESSED_NONFINITE = 2


def _nonfinite_rows(raw_ok: Tensor, processed: Tensor) -> Tensor:
    """[S] long: RAW_NONFINITE where the model's logits had NaN/inf, PROCESSED_NONFINITE where only the processed
    ones broke (NaN, +inf, or every token masked). Such a row's token would be garbage: the engine fails it."""
    broken = processed.amax(-1).isfinite().logical_not()  # [S]: amax is NaN with any NaN, +inf with any, -inf with all
    return torch.where(raw_ok, broken.long() * PROCESSED_NONFINITE, RAW_NONFINITE)


def _draw(processed: Tensor, batch: SamplingBatch, consume: bool = False) -> Tensor:
    """Inverse-CDF draw per sampled row from its (seed, step) uniform: [R] token ids. `consume`: `processed` is
    not read afterwards, so the scan may run in its memory (the same bits, two full-vocabulary buffers fewer)."""
    rows = batch.sampled_rows
    picked = processed if batch.all_sampled else processed[batch.index(rows)]  # [R, V]
    if consume or not batch.all_sampled:  # `picked` is ours: a gathered copy, or `processed` given away
        cdf = picked.exp_().cumsum_(dim=-1)  # [R, V], row-wise scan
    else:
        cdf = torch.cumsum(picked.exp(), dim=-1)
    u = uniforms(*batch.seeds_and_steps(rows))  # [R]
    target = (1.0 - u)[:, None] * cdf[:, -1:]  # in (0, total]
    return torch.searchsorted(cdf, target)[:, 0].clamp_(max=cdf.shape[1] - 1)


def _logprob_source(raw: Tensor, processed: Tensor, batch: SamplingBatch) -> Tensor:
    """[S, V] log-probs each row reports: raw, or processed for processed_logprobs rows."""
    rows = batch.processed_rows
    if not rows:
        return raw
    if len(rows) == raw.shape[0]:
        return processed
    out = raw.clone()
    idx = batch.index(rows)
    out[idx] = processed[idx]
    return out


class Sampler:
    """Rows are independent: each draws from its own seed and its own token count, whatever the batch."""

    def __init__(self, never_sample: Seq[int], eos_ids: Seq[int]) -> None:
        self.never_sample = list(never_sample)
        self.eos_ids = list(eos_ids)

    def process(self, logits: Tensor, batch: SamplingBatch) -> Tensor:
        """Processed logits [S, V], written over `logits`: grammar, masks, bias, penalties, temperature, truncation."""
        apply_grammar(logits, batch)
        mask_tokens(logits, batch, self.never_sample, self.eos_ids)
        apply_penalties(logits, batch)
        apply_temperature(logits, batch)
        truncate(logits, batch)
        return logits

    @torch.inference_mode()
    def sample(self, logits: Tensor, seqs: list[Sequence], store: PersistentBatch | None = None,
               store_rows: Tensor | None = None) -> SampledTokens:
        """logits [S, V] float32, one row per sequence (consumed: processed in place). Nothing is read back.
        `store`, `store_rows`: the engine's persistent batch and the sequences' rows there (their parameters)."""
        batch = SamplingBatch.build(seqs, logits.device, store, store_rows)
        raw_ok = torch.isfinite(logits.sum(-1))  # [S]: a NaN or an inf anywhere in the row makes its sum one
        raw = torch.log_softmax(logits, dim=-1)  # [S, V]
        x = self.process(logits, batch)
        nonfinite = _nonfinite_rows(raw_ok, x)
        need_processed = bool(batch.sampled_rows or batch.processed_rows)
        processed = torch.log_softmax(x, dim=-1) if need_processed else raw  # [S, V]
        if batch.all_sampled:  # every row draws: no greedy argmax to keep
            tokens = _draw(processed, batch, consume=not batch.processed_rows)  # [S]; `processed` read no more
        else:
            tokens = torch.argmax(x, dim=-1)  # [S], greedy rows keep this
            if batch.sampled_rows:
                tokens[batch.index(batch.sampled_rows)] = _draw(processed, batch)
        source = _logprob_source(raw, processed, batch)
        picked = source.gather(1, tokens[:, None])[:, 0]  # [S]
        top_values, top_ids = torch.topk(source, batch.max_top_logprobs, dim=-1)  # [S, K]
        return SampledTokens(batch, tokens, picked, top_values, top_ids, nonfinite)

    def __call__(self, logits: Tensor, seqs: list[Sequence], store: PersistentBatch | None = None,
                 store_rows: Tensor | None = None) -> SampleResult:
        return self.sample(logits, seqs, store, store_rows).readback()
