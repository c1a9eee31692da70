"""Peak RSS of an engine on one long prompt: the figures before and after, to show prefill memory is linear.

Usage: python scripts/bench/long_prompt_peak.py [--model DIR] [--tokens 30000] [--prompt-logprobs K] [--json]
Prints the process's peak RSS after start-up and a short warm-up request, then after the long prompt ran
(prefill plus one sampled token), and the growth between them. One process per measurement: peak RSS only rises.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def peak_rss_mib() -> float:
    """The process's peak resident set so far, MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_prompt(engine: object, ids: list[int], prompt_logprobs: int | None) -> int:
    """Prefill ids and sample one token; the number of engine steps it took."""
    from mm_infer import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=prompt_logprobs)
    engine.add_request(f"r{len(ids)}", {"prompt_token_ids": ids}, params)  # type: ignore[attr-defined]
    steps = 0
    while engine.has_unfinished():  # type: ignore[attr-defined]
        engine.step()  # type: ignore[attr-defined]
        steps += 1
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / "assets/models/tiny-qwen2-vl"))
    parser.add_argument("--tokens", type=int, default=30000)
    parser.add_argument("--prompt-logprobs", type=int, default=None, help="score the prompt (top-K alternatives)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()

    import torch

    from mm_infer.engine.engine import LLMEngine

    options: dict[str, object] = {"cpu_threads": args.threads}
    if args.max_num_batched_tokens:
        options["max_num_batched_tokens"] = args.max_num_batched_tokens
    engine = LLMEngine.from_options(args.model, **options)
    gen = torch.Generator().manual_seed(0)
    run_prompt(engine, torch.randint(0, 3000, (64,), generator=gen).tolist(), args.prompt_logprobs)  # warm-up
    before = peak_rss_mib()
    ids = torch.randint(0, 3000, (args.tokens,), generator=gen).tolist()
    start = time.perf_counter()
    steps = run_prompt(engine, ids, args.prompt_logprobs)
    wall = time.perf_counter() - start
    after = peak_rss_mib()
    result = {"tokens": args.tokens, "steps": steps, "wall_s": round(wall, 2), "peak_rss_before_mib": round(before),
              "peak_rss_after_mib": round(after), "growth_mib": round(after - before)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.tokens} prompt tokens in {steps} steps, {wall:.1f} s: peak RSS {before:.0f} MiB before, "
              f"{after:.0f} MiB after (+{after - before:.0f} MiB)")


if __name__ == "__main__":
    main()
