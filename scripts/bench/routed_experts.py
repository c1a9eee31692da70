"""Benchmark: what R3 (--enable-return-routed-experts) costs the offline engine on an MoE checkpoint.

Two engines on one checkpoint, alike but for the flag, run the same batch of text prompts (a GRPO-like group per
prompt) in alternating rounds; prints output tokens/s of each round and, LAST, the throughput ratio (on / off).
Usage: python scripts/bench/routed_experts.py [--model DIR] [--prompts 16] [--n 4] [--max-tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]


def prompts(count: int) -> list[dict]:
    words = ["river", "stone", "lantern", "harbor", "meadow", "engine", "violet", "cobalt", "thunder", "pepper"]
    return [{"messages": [{"role": "user", "content": " ".join(words[(i * 3 + j * 7) % 10] for j in range(12 + i))}]}
            for i in range(count)]


def tokens_per_s(llm, batch: list[dict], params) -> tuple[float, int]:
    llm.engine.block_manager.reset_prefix_cache()  # every round computes the prompts again
    start = time.perf_counter()
    outs = llm.generate(batch, params, use_tqdm=False)
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    rows = sum(0 if c.routed_experts is None else len(c.routed_experts) for o in outs for c in o.outputs)
    return tokens / (time.perf_counter() - start), rows


def main() -> None:
    from mm_infer import LLM, SamplingParams

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(REPO / "assets" / "models" / "tiny-qwen3-vl-moe"))
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    options = {"num_kv_blocks": 1024, "max_model_len": 2048}
    engines = {"off": LLM(args.model, **options), "on": LLM(args.model, enable_return_routed_experts=True, **options)}
    params = SamplingParams(n=args.n, temperature=1.0, seed=0, max_tokens=args.max_tokens, ignore_eos=True)
    batch = prompts(args.prompts)
    for llm in engines.values():
        tokens_per_s(llm, batch[:2], params)  # warm-up
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(args.rounds):
        for name, llm in engines.items():
            rate, rows = tokens_per_s(llm, batch, params)
            rates[name].append(rate)
            print(f"round {r} R3 {name}: {rate:.1f} output tokens/s, {rows} routing rows returned")
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(f"median: off {off:.1f}, on {on:.1f} output tokens/s")
    print(f"R3 on / off throughput: {on / off:.3f}x")


if __name__ == "__main__":
    main()
