"""The persistent batch: rows written once and then per new block, taken back, equal to rebuilding every step."""

from __future__ import annotations

import pytest
import torch
from engine_cases import CKPT, case
from test_sampler_batched import batch_case

from mm_infer import LLM, SamplingParams
from mm_infer.engine.runner.persistent_batch import PersistentBatch
from mm_infer.engine.sampling.sampler import Sampler
from mm_infer.engine.scheduling.sequence import SequenceStatus

SCRATCH = 99


def running(seqs):
    for s in seqs:
        s.status = SequenceStatus.RUNNING
    return seqs


def table_rows(batch: PersistentBatch, seqs) -> list[list[int]]:
    rows = batch.rows_of(seqs)
    return batch.tables[rows].tolist()


def test_tables_are_written_once_per_new_block_and_padded_with_the_scratch_block():
    _, seqs = batch_case()
    a, b = running(seqs[:2])
    batch = PersistentBatch(capacity=4, max_blocks=5, scratch_block=SCRATCH, device=torch.device("cpu"))
    a.block_table += [3, 4]
    b.block_table += [7]
    assert table_rows(batch, [a, b]) == [[3, 4, SCRATCH, SCRATCH, SCRATCH], [7, SCRATCH, SCRATCH, SCRATCH, SCRATCH]]
    assert batch.entries_written == 3
    assert table_rows(batch, [b, a]) == [[7] + [SCRATCH] * 4, [3, 4] + [SCRATCH] * 3]  # nothing new: nothing moved
    assert batch.entries_written == 3
    b.block_table.append(8)
    assert table_rows(batch, [a, b])[1] == [7, 8, SCRATCH, SCRATCH, SCRATCH] and batch.entries_written == 4


def test_a_preempted_sequence_gets_its_new_table_with_no_stale_entries():
    _, seqs = batch_case()
    (a,) = running(seqs[:1])
    batch = PersistentBatch(capacity=2, max_blocks=4, scratch_block=SCRATCH, device=torch.device("cpu"))
    a.block_table += [1, 2, 3]
    table_rows(batch, [a])
    a.block_table = [5]  # the block manager frees a preempted sequence's table and allocates a new list
    assert table_rows(batch, [a]) == [[5, SCRATCH, SCRATCH, SCRATCH]]


def test_rows_of_stopped_sequences_are_taken_back_and_their_parameters_rewritten():
    _, seqs = batch_case()
    seqs = running(seqs[:4])
    batch = PersistentBatch(capacity=3, max_blocks=2, scratch_block=SCRATCH, device=torch.device("cpu"))
    first = batch.rows_of(seqs[:3]).tolist()
    seqs[1].status = SequenceStatus.FINISHED
    row = batch.rows_of([seqs[3]]).tolist()
    assert row == [first[1]]  # the finished sequence's row, reused
    assert batch.column("temperature")[row[0]].item() == pytest.approx(seqs[3].params.temperature)
    assert batch.column("min_p")[row[0]].item() == pytest.approx(seqs[3].params.min_p)
    with pytest.raises(RuntimeError, match="more than 3 running sequences"):
        batch.rows_of([seqs[0], seqs[2], seqs[3], seqs[1].__class__(seqs[1].group, [1])])


def test_sampling_from_the_persistent_rows_equals_sampling_from_the_parameters():
    """Every kind of row (greedy, top-k/p, min-p, penalties, bias, min_tokens) with its parameters gathered from
    the persistent rows, in a shuffled row order: the same tokens, logprobs and top-k as built from the host. A
    row gathering another row's temperature, top_p, min_p or seed would differ."""
    logits, seqs = batch_case(seed=3)
    running(seqs)
    batch = PersistentBatch(capacity=16, max_blocks=1, scratch_block=0, device=torch.device("cpu"))
    batch.rows_of(list(reversed(seqs)))  # rows assigned in another order than the step's
    rows = batch.rows_of(seqs)
    assert rows.tolist() != list(range(len(seqs)))
    from_host = Sampler([], [1])(logits.clone(), seqs)
    from_rows = Sampler([], [1])(logits.clone(), seqs, batch, rows)
    assert from_rows.token_ids == from_host.token_ids and from_rows.logprobs == from_host.logprobs
    assert from_rows.top_logprobs == from_host.top_logprobs


def test_engine_moves_each_block_once_over_a_generation():
    """Three sequences decoding 40 tokens: the persistent tables receive each sequence's blocks once (not the
    whole table every step), and the tokens are those of the same prompts run one at a time."""
    prompts = [case([5 + i, ("image", 1, 4, 4), 3], seed=60 + i) for i in range(3)]
    params = SamplingParams(temperature=1.0, seed=11, max_tokens=40, ignore_eos=True)
    llm = LLM(str(CKPT), num_kv_blocks=128, cpu_threads=1)
    together = llm.generate(prompts, params, use_tqdm=False)
    batch = llm.engine.runner.batch
    blocks = sum(-(-(len(o.prompt_token_ids) + 40 - 1) // 16) for o in together)  # the last token is not cached
    assert batch.entries_written == blocks
    for prompt, out in zip(prompts, together, strict=True):
        assert llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids == out.outputs[0].token_ids
