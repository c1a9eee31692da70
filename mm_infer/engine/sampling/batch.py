"""SamplingBatch: one step's per-row sampling parameters, gathered once on the host, as device tensors."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mm_infer.engine.runner.persistent_batch import SAMPLING_COLUMNS, PersistentBatch, host_to_device
from mm_infer.engine.sampling.random_draws import seed_to_int64
from mm_infer.engine.scheduling.sequence import Sequence


def _rows(flags: list[bool]) -> list[int]:
    return [i for i, f in enumerate(flags) if f]


@dataclass
class SamplingBatch:
    """Host lists say which rows need which processing (no device reads); tensors hold the per-row values.

    Row subsets are plain lists, known from the parameters alone, so no step ever syncs to decide what to run.
    With a persistent batch (the engine's), temperature, top_p, min_p and seeds are gathered from its device rows
    rather than sent from the host each step.
    """

    seqs: list[Sequence]
    device: torch.device
    sampled_rows: list[int]  # temperature > 0
    scaled_rows: list[int]  # sampled with temperature != 1 (dividing by 1 changes no bit: those rows skip it)
    top_k_rows: list[int]
    top_p_rows: list[int]
    min_p_rows: list[int]
    penalty_rows: list[int]
    processed_rows: list[int]  # logprobs_mode == processed_logprobs
    max_top_logprobs: int  # the largest `logprobs` asked for (0: none)
    grammar_rows: list[int]  # structured outputs: a grammar matcher masks the row's tokens (not while it reasons)
    store: PersistentBatch | None = None
    store_rows: Tensor | None = None  # [S] long: each row's row in `store`

    @staticmethod
    def build(seqs: list[Sequence], device: torch.device, store: PersistentBatch | None = None,
              store_rows: Tensor | None = None) -> SamplingBatch:
        ps = [s.params for s in seqs]
        return SamplingBatch(
            seqs, device,
            sampled_rows=_rows([not p.greedy for p in ps]),
            scaled_rows=_rows([not p.greedy and p.temperature != 1.0 for p in ps]),
            top_k_rows=_rows([not p.greedy and p.top_k > 0 for p in ps]),
            top_p_rows=_rows([not p.greedy and p.top_p < 1.0 for p in ps]),
            min_p_rows=_rows([not p.greedy and p.min_p > 0.0 for p in ps]),
            penalty_rows=_rows([p.has_penalties for p in ps]),
            processed_rows=_rows([p.logprobs_mode == "processed_logprobs" for p in ps]),
            max_top_logprobs=max((p.logprobs or 0 for p in ps), default=0),
            grammar_rows=_rows([s.grammar_matcher is not None for s in seqs]),
            store=store, store_rows=store_rows,
        )

    @property
    def all_sampled(self) -> bool:
        """Every row draws (temperature > 0): processing can run in place over the whole batch."""
        return len(self.sampled_rows) == len(self.seqs)

    def index(self, rows: list[int]) -> Tensor:
        """[len(rows)] long row indices on the device."""
        return self.tensor(rows, torch.long)

    def tensor(self, values: list, dtype: torch.dtype) -> Tensor:
        return host_to_device(values, dtype, self.device)

    def _in_store(self, rows: list[int]) -> Tensor:
        """[len(rows)] long: those rows' rows in the persistent batch (rows are sorted and distinct)."""
        return self.store_rows if len(rows) == len(self.seqs) else self.store_rows[self.index(rows)]

    def per_row(self, rows: list[int], field: str, dtype: torch.dtype = torch.float32) -> Tensor:
        """[len(rows)] values of one SamplingParams field for those rows."""
        if self.store is not None and field in SAMPLING_COLUMNS and dtype == torch.float32:
            return self.store.column(field)[self._in_store(rows)]
        return self.tensor([getattr(self.seqs[i].params, field) for i in rows], dtype)

    def seeds_and_steps(self, rows: list[int]) -> tuple[Tensor, Tensor]:
        """[R] int64 seeds and [R] int64 draw indices (the number of tokens each row has generated)."""
        if self.store is not None:
            seeds = self.store.seeds[self._in_store(rows)]
        else:
            seeds = self.tensor([seed_to_int64(self.seqs[i].seed) for i in rows], torch.long)
        steps = self.tensor([self.seqs[i].num_output_tokens for i in rows], torch.long)
        return seeds, steps

    def grammar_bitmask(self, vocab: int) -> Tensor:
        """[G, ceil(vocab/32)] int32 on the device: each grammar row's allowed next tokens, filled on the host from
        its matcher's state (no device read) and moved in one copy."""
        from mm_infer.structured.compiler import fill_bitmask  # loaded already: the rows' grammars were compiled

        matchers = [self.seqs[i].grammar_matcher for i in self.grammar_rows]
        return fill_bitmask(matchers, vocab).to(self.device, non_blocking=True)

    def padded_ids(self, rows: list[int], vocab: int, *, outputs_only: bool) -> Tensor:
        """[R, L] long token ids of each row (prompt + output, or output only), padded with `vocab`."""
        lists = [self.seqs[i].output_token_ids if outputs_only else self.seqs[i].token_ids for i in rows]
        width = max((len(ids) for ids in lists), default=0)
        return self.tensor([ids + [vocab] * (width - len(ids)) for ids in lists], torch.long)
