"""The batched sampler: rows independent of their batch, equal to a per-row reference, draws uniform and seeded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mm_infer import SamplingParams
from mm_infer.engine.sampling.random_draws import seed_to_int64, uniforms
from mm_infer.engine.sampling.sampler import Sampler
from mm_infer.engine.scheduling.sequence import Sequence, SequenceGroup

VOCAB = 64
ROW_KINDS = [
    dict(temperature=0.0),
    dict(temperature=0.7, top_p=0.8),
    dict(temperature=1.3, top_k=5),
    dict(temperature=1.0, min_p=0.1),
    dict(temperature=0.9, top_k=12, top_p=0.9, min_p=0.02, logprobs_mode="processed_logprobs"),
    dict(temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.4, presence_penalty=0.3, logprobs=5),
    dict(temperature=1.0, repetition_penalty=0.8, logit_bias={7: 3.0, 9: -2.0}, logprobs=2),
    dict(temperature=1.0, min_tokens=4, stop_token_ids=[3], logprobs=0),
]


def make_seq(seed: int, prompt: list[int], output: list[int], **kw) -> Sequence:
    group = SequenceGroup("r", SamplingParams(seed=seed, **kw), SimpleNamespace(placeholders=[], item_patches=[]))
    seq = Sequence(group, prompt)
    seq.token_ids += output
    seq.seed = seed
    return seq


def batch_case(seed: int = 0) -> tuple[torch.Tensor, list[Sequence]]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(ROW_KINDS), VOCAB, generator=gen) * 3  # [S, V]
    seqs = [make_seq(100 + i, torch.randint(0, VOCAB, (5,), generator=gen).tolist(),
                     torch.randint(0, VOCAB, (i % 4,), generator=gen).tolist(), **kw)
            for i, kw in enumerate(ROW_KINDS)]
    return logits, seqs


def reference_row(row: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """The per-row processing the batched ops must equal (pad mask and bias excluded: none here but bias)."""
    p, x = seq.params, row.clone()
    for tok, val in p.logit_bias.items():
        x[tok] += val
    if seq.num_output_tokens < p.min_tokens:
        x[p.stop_token_ids + [1]] = float("-inf")
    if p.has_penalties:
        seen = torch.zeros(VOCAB, dtype=torch.bool)
        seen[torch.tensor(seq.token_ids)] = True
        x[seen] = torch.where(x[seen] > 0, x[seen] / p.repetition_penalty, x[seen] * p.repetition_penalty)
        counts = torch.bincount(torch.tensor(seq.output_token_ids, dtype=torch.long), minlength=VOCAB).float()
        x -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
    if not p.greedy:
        x /= p.temperature
        if p.top_k:
            x[x < torch.topk(x, p.top_k).values[-1]] = float("-inf")
        if p.top_p < 1.0:
            srt, order = torch.sort(x, descending=True, stable=True)
            probs = torch.softmax(srt, -1)
            x[order[probs.cumsum(-1) - probs > p.top_p]] = float("-inf")
        if p.min_p:
            probs = torch.softmax(x, -1)
            x[probs < p.min_p * probs.max()] = float("-inf")
    return x


def test_batched_processing_equals_the_per_row_reference():
    # catches: a row processed with another row's parameters, or a processor applied to rows that did not ask
    logits, seqs = batch_case()
    from mm_infer.engine.sampling.batch import SamplingBatch

    got = Sampler([], [1]).process(logits.clone(), SamplingBatch.build(seqs, logits.device))
    for i, seq in enumerate(seqs):
        assert torch.equal(got[i], reference_row(logits[i], seq)), ROW_KINDS[i]


def test_each_row_samples_the_same_alone_and_in_the_batch():
    # catches: draws or masks that depend on the batch (shared uniforms, a kmax applied to every row)
    logits, seqs = batch_case(1)
    together = Sampler([], [1])(logits.clone(), seqs)
    for i, seq in enumerate(seqs):
        alone = Sampler([], [1])(logits[i:i + 1].clone(), [seq])
        assert (alone.token_ids[0], alone.logprobs[0], alone.top_logprobs[0]) == (
            together.token_ids[i], together.logprobs[i], together.top_logprobs[i]), ROW_KINDS[i]
    assert [len(t) if t is not None else None for t in together.top_logprobs] == [
        kw.get("logprobs") or None for kw in ROW_KINDS]


def test_draws_follow_the_distribution():
    # catches: an off-by-one in the inverse CDF, temperature not applied, a biased uniform
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))
    n = 4000
    seqs = [make_seq(s, [0], [], temperature=1.0) for s in range(n)]
    tokens = Sampler([], [])(logits.repeat(n, 1), seqs).token_ids
    freq = torch.bincount(torch.tensor(tokens), minlength=4).float() / n
    expected = torch.tensor([0.5, 0.25, 0.15, 0.1])
    assert (freq - expected).abs().max() < 4 * (0.25 / n) ** 0.5, freq


def test_uniforms_are_uniform_and_uncorrelated():
    # catches: a hash with fixed points, low-entropy bits, or streams that repeat across seeds or steps
    seeds = torch.arange(200).repeat_interleave(100)
    steps = torch.arange(100).repeat(200)
    u = uniforms(seeds, steps)  # [20000]
    assert u.min() >= 0.0 and u.max() < 1.0 and u.unique().numel() > 19900
    hist = torch.histc(u, bins=10, min=0.0, max=1.0)
    assert (hist - 2000).abs().max() < 200, hist
    grid = u.view(200, 100)
    for a, b in ((grid[:-1], grid[1:]), (grid[:, :-1], grid[:, 1:])):  # neighbouring seeds, neighbouring steps
        assert abs(torch.corrcoef(torch.stack([a.reshape(-1), b.reshape(-1)]))[0, 1]) < 0.05


@pytest.mark.parametrize("seed", [0, 2**63 - 1, 2**63, 2**64 - 1, -1, 10**30])
def test_any_integer_seed_is_a_valid_stream(seed):
    # catches: manual_seed's overflow on seeds >= 2^64 (a 400 that used to leave an orphan sequence)
    s = torch.tensor([seed_to_int64(seed)] * 3)
    u = uniforms(s, torch.arange(3))
    assert torch.equal(u, uniforms(torch.tensor([seed_to_int64(seed % 2**64)] * 3), torch.arange(3)))
    assert u.unique().numel() == 3


def test_same_seed_same_tokens_different_seed_different_tokens():
    logits = torch.zeros(1, 1000)
    draw = [Sampler([], [])(logits.clone(), [make_seq(s, [0], [], temperature=1.0)]).token_ids[0]
            for s in (5, 5, 6)]
    assert draw[0] == draw[1] != draw[2]


def test_cpu_uniforms_equal_the_torch_steps():
    # catches: the numpy path of the CPU rounding or shifting differently from the torch steps other devices run
    # (a logical shift for the arithmetic one, a float64 scale, a lost sign bit of a negative seed)
    from mm_infer.engine.sampling.random_draws import _hash

    gen = torch.Generator().manual_seed(3)
    seeds = torch.cat([torch.randint(-(1 << 62), 1 << 62, (500,), generator=gen), torch.tensor([0, -1, 1 << 62])])
    steps = torch.cat([torch.randint(0, 1 << 40, (500,), generator=gen), torch.tensor([0, 0, (1 << 33) + 5])])
    torch_path = (_hash(seeds, steps) >> 8).to(torch.float32) * (1.0 / (1 << 24))
    got = uniforms(seeds, steps)
    assert got.dtype == torch.float32 and torch.equal(got, torch_path)


def test_cpu_readback_lists_what_the_packed_readback_gives():
    # catches: the packed (accelerator) readback and the CPU one reading different slices: a top id taken for a
    # logprob, a shifted row, a NaN flag lost
    logits, seqs = batch_case(4)
    logits[2, 3] = float("nan")  # a broken row: flagged in both
    sampled = Sampler([], [1]).sample(logits, seqs)
    for listed, packed in zip(sampled.listed(), sampled.packed(), strict=True):
        assert len(listed) == len(packed)
        assert all(a == b or (a != a and b != b) for a, b in zip(listed, packed, strict=True))  # NaN: both NaN
    assert sampled.listed()[0][2] != 0 and len(sampled.listed()[3]) == len(seqs) * 5
