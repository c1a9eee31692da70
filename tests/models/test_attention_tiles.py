"""Prefill attention in query tiles: bit for bit the untiled product, scores under the tile budget, peak RSS linear."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mm_infer.models.attention as attention
from mm_infer.models.attention import MIN_TILE_ROWS, causal_attention_batch, query_tile_rows, query_tiles

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "lq", "lk", "hq", "hkv", "d", "tile_rows"), [
    (1, 300, 300, 4, 2, 32, 16),  # a prompt: the last tile overlaps the one before (300 = 18 x 16 + 12)
    (3, 200, 520, 4, 2, 32, 16),  # chunks after a prefix hit (masked form), a group per sequence
    (3, 200, 520, 4, 2, 32, 48),
    (2, 257, 257, 14, 2, 64, 32),  # GQA ratio 7, two sequences per group
    (1, 1000, 1000, 4, 4, 16, 112),  # keys long enough that a shorter PV reduction would round otherwise
])
def test_tiled_attention_equals_untiled_bit_for_bit(monkeypatch, n, lq, lk, hq, hkv, d, tile_rows, dtype):
    # catches: a tile's mask offset by its first row, the overlapped last tile writing rows twice or missing some,
    # a group slicing the wrong (sequence x head) batches, tiles reading fewer keys (their PV sum rounds otherwise)
    gen = torch.Generator().manual_seed(lq + lk + tile_rows)
    q = torch.randn(n, lq, hq, d, generator=gen).to(dtype)
    k = torch.randn(n, lk, hkv, d, generator=gen).to(dtype)
    v = torch.randn(n, lk, hkv, d, generator=gen).to(dtype)
    whole = causal_attention_batch(q, k, v)  # the default budget holds these in one tile
    budget = tile_rows * hq * lk * 4 * (2 if hq == 14 else 1)  # hq 14: room for two sequences per group
    monkeypatch.setattr(attention, "SCORE_TILE_BYTES", budget)
    assert query_tile_rows(hq, lq, lk) == (tile_rows * 2 if hq == 14 else tile_rows) < lq
    tiled = causal_attention_batch(q, k, v)
    assert tiled.dtype == dtype and tiled.shape == q.shape
    assert torch.equal(tiled, whole)


def test_query_tiles_cover_each_row_once_and_none_is_short():
    for lq, rows in [(300, 16), (256, 16), (17, 16), (1000, 112), (5, 16)]:
        tiles = query_tiles(lq, rows)
        written = [r for _, r1, w0 in tiles for r in range(w0, r1)]
        assert written == list(range(lq)), (lq, rows)
        assert all(r1 - r0 == min(rows, lq) and r0 <= w0 < r1 for r0, r1, w0 in tiles)


def test_tile_scores_fit_the_budget_and_depend_on_the_sequence_alone():
    budget = attention.SCORE_TILE_BYTES
    for hq, lq, lk in [(4, 8192, 30000), (28, 8192, 32768), (4, 30000, 30000), (64, 8192, 131072)]:
        rows = query_tile_rows(hq, lq, lk)
        assert rows % MIN_TILE_ROWS == 0 and rows < lq
        assert rows * hq * lk * 4 <= budget or rows == MIN_TILE_ROWS  # the floor: row-invariant GEMMs
    assert query_tile_rows(4, 80, 80) == 80  # normal prompts: one tile, the untiled product


PEAK_CHILD = """
import json, resource, torch
from mm_infer.models.attention import causal_attention_batch
torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
n, hq, hkv, d = 1, 4, 2, 32
q, k, v = (torch.randn(1, {L}, h, d, generator=gen) for h in (hq, hkv, hkv))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = causal_attention_batch(q, k, v)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"growth_mib": (after - before) / 1024}}))
"""


def test_long_prefill_peak_rss_is_linear_in_the_prompt():
    # catches: scores built whole ([Hq, L, L] float32 and its softmax: 2 GiB at L = 8192 on 4 heads)
    length = 8192
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", PEAK_CHILD.format(L=length)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300, check=True)
    growth = json.loads(proc.stdout.strip().splitlines()[-1])["growth_mib"]
    tile = attention.SCORE_TILE_BYTES / 2**20
    linear = 2 * 4 * length * 32 * 4 / 2**20  # expanded keys and values [Hq, L, d] float32, and the output
    bound = 4 * tile + 2 * linear  # a tile of scores, its softmax, the tile's mask, slack (it was 2.4 GiB)
    assert growth < bound, f"attention over {length} tokens grew the peak RSS by {growth:.0f} MiB, over {bound:.0f}"
