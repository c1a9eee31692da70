"""PersistentBatch: per-sequence step state kept in device rows across steps (vLLM V1's input batch idea)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mm_infer.engine.sampling.random_draws import seed_to_int64
from mm_infer.engine.scheduling.sequence import Sequence, SequenceStatus

# the float sampling parameters each row holds, in column order of `PersistentBatch.sampling`
SAMPLING_COLUMNS = ("temperature", "top_p", "min_p")


def host_to_device(values: list, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A host list (of numbers, or of equal-length lists) as a tensor on `device`: one copy, not waited for."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


@dataclass
class _Row:
    index: int
    seq: Sequence
    table: list[int]  # the seq.block_table list the row's entries came from (a freed sequence gets a new list)
    written: int  # leading entries of `table` the row holds


class PersistentBatch:
    """Rows of per-sequence state on the model's device, written when they change rather than rebuilt each step.

    tables [R, max_blocks] int32: each row's block table; entries past its blocks hold `scratch_block` (the
    runner passes its zero block, which nothing writes: a masked read of it multiplies zeros, never stale KV).
    sampling [R, 3] float32: temperature, top_p, min_p. seeds [R] int64: each row's draw stream.

    A sequence gets a row the first step it is given, and its parameters are written then; a block it gains is
    written as one entry. A step then moves only those new entries and its rows' indices to the device. Rows of
    sequences that are no longer running are taken back when rows run out.
    """

    def __init__(self, capacity: int, max_blocks: int, scratch_block: int, device: torch.device) -> None:
        self.capacity, self.max_blocks, self.scratch_block = capacity, max_blocks, scratch_block
        self.device = device
        self.tables = torch.full((capacity, max_blocks), scratch_block, dtype=torch.int32, device=device)
        self.sampling = torch.ones(capacity, len(SAMPLING_COLUMNS), dtype=torch.float32, device=device)
        self.seeds = torch.zeros(capacity, dtype=torch.long, device=device)
        self._rows: dict[int, _Row] = {}  # seq_id -> its row
        self._free = list(range(capacity - 1, -1, -1))
        self.entries_written = 0  # table entries moved to the device since start (tests read it)

    def rows_of(self, seqs: list[Sequence]) -> Tensor:
        """[len(seqs)] long row indices on the device, after writing what changed since each row was last used."""
        fresh: list[_Row] = []
        cleared: list[int] = []  # rows whose old entries go back to the fill block
        entries: list[tuple[int, int, int]] = []  # (row, column, block id)
        indices = []
        for seq in seqs:
            row = self._rows.get(seq.seq_id)
            if row is None:
                row = self._assign(seq)
                fresh.append(row)
            if row.table is not seq.block_table:  # freed (preempted) and allocated anew since the row was written
                cleared.append(row.index)
                row.table, row.written = seq.block_table, 0
            end = min(len(row.table), self.max_blocks)
            entries.extend((row.index, col, row.table[col]) for col in range(row.written, end))
            row.written = max(row.written, end)
            indices.append(row.index)
        self._write(fresh, cleared, entries)
        return self._to_device(indices, torch.long)

    def column(self, name: str) -> Tensor:
        """[R] float32 values of one sampling parameter (a view of `sampling`)."""
        return self.sampling[:, SAMPLING_COLUMNS.index(name)]

    def _assign(self, seq: Sequence) -> _Row:
        if not self._free:
            self._take_back()
        row = _Row(self._free.pop(), seq, [], 0)
        self._rows[seq.seq_id] = row
        return row

    def _take_back(self) -> None:
        """Free the rows of sequences that stopped running (finished, aborted, or preempted: a preempted one gets
        a new row when it runs again)."""
        for seq_id, row in list(self._rows.items()):
            if row.seq.status is not SequenceStatus.RUNNING:
                del self._rows[seq_id]
                self._free.append(row.index)
        if not self._free:
            raise RuntimeError(f"more than {self.capacity} running sequences for the persistent batch")

    def _write(self, fresh: list[_Row], cleared: list[int], entries: list[tuple[int, int, int]]) -> None:
        """One host-to-device copy per kind of change: parameters of new rows, cleared rows, new table entries."""
        if fresh:
            at = self._to_device([r.index for r in fresh], torch.long)
            params = [[getattr(r.seq.params, name) for name in SAMPLING_COLUMNS] for r in fresh]
            self.sampling[at] = self._to_device(params, torch.float32)
            self.seeds[at] = self._to_device([seed_to_int64(r.seq.seed) for r in fresh], torch.long)
        if cleared:
            self.tables[self._to_device(cleared, torch.long)] = self.scratch_block
        if entries:
            packed = self._to_device(entries, torch.long)  # [E, 3]
            self.tables[packed[:, 0], packed[:, 1]] = packed[:, 2].to(torch.int32)
            self.entries_written += len(entries)

    def _to_device(self, values: list, dtype: torch.dtype) -> Tensor:
        return host_to_device(values, dtype, self.device)
