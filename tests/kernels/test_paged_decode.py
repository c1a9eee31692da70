"""Paged decode attention: Triton (CUDA, or the interpreter) against the torch reference and a dense oracle."""

from __future__ import annotations

import pytest
import torch
from kernel_cases import paged_cache

from mm_infer.models.attention import causal_attention
from mm_infer_kernels import paged_decode as pd

BLOCK = 16


def case(device, lens: list[int], hq: int = 6, hkv: int = 2, d: int = 16, seed: int = 0):
    """Caches with scattered (shuffled) blocks per sequence; block tables padded with block 0."""
    g = torch.Generator().manual_seed(seed)
    k, v, tables = paged_cache(lens, hkv, d, BLOCK, g)
    q = torch.randn(len(lens), hq, d, generator=g)
    put = lambda t: t.to(device)  # noqa: E731
    return put(q), put(k), put(v), put(torch.tensor(tables, dtype=torch.int32)), put(torch.tensor(lens)), tables


def dense(q, k, v, tables, lens):
    """Oracle: gather each sequence's context and attend with SDPA (its query is the last position)."""
    outs = []
    for i, n in enumerate(lens.tolist()):
        slots = (torch.tensor(tables[i])[:, None] * BLOCK + torch.arange(BLOCK)).reshape(-1)[:n].to(q.device)
        outs.append(causal_attention(q[i:i + 1], k[:, slots].transpose(0, 1), v[:, slots].transpose(0, 1)))
    return torch.cat(outs)


@pytest.mark.parametrize("lens", [[1], [5, 16, 17, 40], [33, 2, 64]])
def test_reference_equals_dense_attention(lens):
    # catches: a wrong slot formula (block * size + offset), padding keys not masked, GQA heads mapped wrongly
    q, k, v, tables, lengths, raw = case("cpu", lens)
    got = pd.paged_decode_reference(q, k, v, tables, lengths, BLOCK)
    torch.testing.assert_close(got, dense(q, k, v, raw, lengths), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("lens, hq, hkv, d", [([5, 16, 17, 40], 6, 2, 16), ([3, 70], 7, 1, 24), ([1, 2], 4, 4, 8)])
def test_the_sdpa_path_equals_the_reference(lens, hq, hkv, d):
    # catches: the mask's sense (keep vs pad), GQA grouping in SDPA (enable_gqa), the [B, Hkv, W, D] transpose
    q, k, v, tables, lengths, raw = case("cpu", lens, hq, hkv, d)
    got = pd.paged_decode_sdpa(q, k, v, tables, lengths, BLOCK)
    torch.testing.assert_close(got, pd.paged_decode_reference(q, k, v, tables, lengths, BLOCK), atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(got, dense(q, k, v, raw, lengths), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("lens, hq, hkv, d", [([5, 16, 17, 40], 6, 2, 16), ([3, 70], 7, 1, 24), ([1, 2], 4, 4, 8)])
def test_triton_equals_the_reference(device, lens, hq, hkv, d):
    # catches: the online-softmax rescale, the length loop bound, padded GQA groups / head dims in the kernel
    q, k, v, tables, lengths, _ = case(device, lens, hq, hkv, d)
    got = pd.paged_decode_triton(q, k, v, tables, lengths, BLOCK)
    torch.testing.assert_close(got, pd.paged_decode_reference(q, k, v, tables, lengths, BLOCK), atol=2e-5, rtol=1e-4)


def test_blocks_past_a_sequence_length_are_never_read(device):
    # poison every block a sequence does not own: its output must not change
    q, k, v, tables, lengths, raw = case(device, [20, 9])
    clean = pd.paged_decode_triton(q, k, v, tables, lengths, BLOCK)
    owned = {b for i, n in enumerate(lengths.tolist()) for b in raw[i][:-(-n // BLOCK)]}
    for blk in set(range(k.shape[1] // BLOCK)) - owned:
        k[:, blk * BLOCK:(blk + 1) * BLOCK] = float("nan")
        v[:, blk * BLOCK:(blk + 1) * BLOCK] = float("nan")
    # the tail of a partly used block is masked too
    for i, n in enumerate(lengths.tolist()):
        last = raw[i][(n - 1) // BLOCK]
        k[:, last * BLOCK + (n - 1) % BLOCK + 1:(last + 1) * BLOCK] = float("nan")
    torch.testing.assert_close(pd.paged_decode_triton(q, k, v, tables, lengths, BLOCK), clean)
