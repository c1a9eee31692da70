"""Tensor parallelism: TP=2 against TP=1 on the 2B-shaped random Qwen2-VL (bf16, built at bench time), the same
total threads (TP=1 on N threads, TP=2 on N/2 per rank). On a 2-core CPU this measures TP's overhead (the
collectives and the duplicated host work), not a speed-up; rerun it on GPUs. Ratio (TP=2 tok/s over TP=1) LAST."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

from mm_infer import LLM, SamplingParams
from scripts.bench.realistic import DEFAULT_MODEL, ensure_checkpoint

REPO = Path(__file__).resolve().parents[2]
IMAGE = REPO / "assets" / "media" / "shapes" / "colour_example.png"


def prompts(batch: int) -> list[dict[str, Any]]:
    """Image chats, each with its own question (no two share a whole prompt)."""
    return [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                                          "text": f"Question {i}: what colour?"}]}],
             "multi_modal_data": {"image": [str(IMAGE)]}} for i in range(batch)]


def run(model: Path, tp: int, threads: int, batch: int, tokens: int, repeats: int) -> tuple[float, list]:
    """Best tok/s over `repeats` generate calls of the batch, and the last call's token ids."""
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    with LLM(str(model), dtype="bfloat16", tensor_parallel_size=tp, cpu_threads=threads,
             enable_prefix_caching=False) as llm:
        llm.generate(prompts(2), SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)  # warm-up
        best, ids = 0.0, []
        for _ in range(repeats):
            start = time.perf_counter()
            outs = llm.generate(prompts(batch), params, use_tqdm=False)
            best = max(best, batch * tokens / (time.perf_counter() - start))
            ids = [list(o.outputs[0].token_ids) for o in outs]
    return best, ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="total, over all ranks")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    ensure_checkpoint(args.model)
    one, ids1 = run(args.model, 1, args.threads, args.batch, args.tokens, args.repeats)
    print(f"tp1: {one:.1f} tok/s on {args.threads} threads", flush=True)
    two, ids2 = run(args.model, 2, max(args.threads // 2, 1), args.batch, args.tokens, args.repeats)
    print(f"tp2: {two:.1f} tok/s on 2 ranks x {max(args.threads // 2, 1)} threads", flush=True)
    same = sum(a == b for a, b in zip(ids1, ids2, strict=True))
    print(f"greedy sequences equal at TP=2 and TP=1 (bf16): {same}/{len(ids1)}")
    print(f"tp2_vs_tp1={two / one:.3f}")


if __name__ == "__main__":
    main()
