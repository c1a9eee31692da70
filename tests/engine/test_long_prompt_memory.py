"""Long prompts: prompt logprobs scored in row blocks equal one block, and an engine's peak RSS stays linear."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from engine_cases import CKPT

import mm_infer.engine.runner.model_runner as model_runner
from mm_infer import SamplingParams
from mm_infer.llm import LLM

REPO = Path(__file__).resolve().parents[2]
VOCAB = 3008  # the tiny checkpoint's


def _scored(llm: LLM, ids: list[int]) -> tuple[list, list, list, list[int]]:
    """Prompt logprobs, top-3 and ranks of ids, and the two greedy tokens after them."""
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=3)
    out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
    return out.prompt_logprobs, out.prompt_top_logprobs, out.prompt_ranks, out.outputs[0].token_ids


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_prompt_logprobs_in_row_blocks_equal_one_block(monkeypatch, batch_invariant):
    # catches: a scoring split across blocks losing, repeating or misaligning rows (targets off by the block start),
    # top-k or ranks of one block given to another, and blocks whose GEMM rows round otherwise (short last blocks)
    threads = torch.get_num_threads()
    llm = LLM(str(CKPT), num_kv_blocks=64, max_num_batched_tokens=64, cpu_threads=1, batch_invariant=batch_invariant)
    torch.set_num_threads(threads)
    model = llm.engine.runner.model
    calls: list[int] = []
    real = model.compute_logits
    monkeypatch.setattr(model, "compute_logits", lambda hidden: calls.append(hidden.shape[0]) or real(hidden))
    ids = torch.randint(0, 3000, (150,), generator=torch.Generator().manual_seed(5)).tolist()
    whole = _scored(llm, ids)
    assert max(calls) >= 63  # chunks of 64: 63 or 64 rows scored in one block
    calls.clear()
    monkeypatch.setattr(model_runner, "LOGIT_BLOCK_BYTES", 20 * VOCAB * 4)  # 20 rows a block
    blocked = _scored(llm, ids)
    assert max(calls) == 20 and set(calls) - {1} <= {16, 20}  # short blocks padded to MIN_ROWS; 1: decode steps
    assert len(whole[0]) == len(ids) and whole[0][0] is None
    assert blocked == whole  # logprobs, top-k and ranks bit for bit, and the same tokens


def test_long_prompt_engine_peak_rss_is_linear():
    # catches: prefill scores [Hq, chunk, context] built whole (1.1 GiB here, 4.5 GiB at 16k tokens), or the
    # scheduler letting one request's chunk past max_num_batched_tokens
    tokens, budget = 9000, 4096
    proc = subprocess.run([sys.executable, str(REPO / "scripts/bench/long_prompt_peak.py"), "--tokens", str(tokens),
                           "--max-num-batched-tokens", str(budget), "--prompt-logprobs", "1", "--json"],
                          capture_output=True, text=True, cwd=REPO, timeout=600, check=True)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["steps"] == -(-tokens // budget)  # every chunk bounded by the configured step budget
    tile_mib = 64  # attention.SCORE_TILE_BYTES and model_runner.LOGIT_BLOCK_BYTES
    bound = 8 * tile_mib + tokens * 16 / 1024  # scores, softmax, logits and log-softmax blocks; per-token lists
    assert got["growth_mib"] < bound, got
