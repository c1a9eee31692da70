"""GPU check of tensor parallelism: TP=2 (NCCL, one rank per GPU, CUDA graphs on) against TP=1 on tiny Qwen2-VL
and Qwen3-VL-MoE, greedy float32 over text, image and video: ids equal, the largest logprob gap, and the decode
graphs each rank captured. Needs 2 GPUs; with fewer it prints "tp: skipped: N GPU(s)" and exits 0 (`--dry-run`
does that on any machine, after checking its imports and files). Last line: the key figures.
Usage: python scripts/gpu/tp_check.py [--json OUT] [--dry-run]"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "parallel"))
CHECKPOINTS = ("tiny-qwen2-vl", "tiny-qwen3-vl-moe")


def gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def compare(name: str) -> dict:
    """TP=1 and TP=2 outputs of one checkpoint on CUDA: ids equal, largest logprob gap, seconds."""
    from tp_cases import GREEDY, MODELS, max_logprob_gap, prompts, token_ids

    from mm_infer import LLM
    from scripts.gpu.check_common import graph_counts

    options = {"device": "cuda", "dtype": "float32", "num_kv_blocks": 256, "max_model_len": 1024}
    start = time.perf_counter()
    with LLM(str(MODELS / name), **options) as one:
        a = one.generate(prompts(), GREEDY, use_tqdm=False)
    with LLM(str(MODELS / name), tensor_parallel_size=2, **options) as two:
        b = two.generate(prompts(), GREEDY, use_tqdm=False)
        captured, failed = graph_counts(two)
    return {"ids_equal": token_ids(a) == token_ids(b), "logprob_gap": max_logprob_gap(a, b),
            "graphs_captured_rank0": captured, "graphs_failed_rank0": failed,
            "seconds": round(time.perf_counter() - start, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="check imports and files, then skip as with 1 GPU")
    args = parser.parse_args()
    import tp_cases  # noqa: F401 - the test cases this check runs must import here

    missing = [n for n in CHECKPOINTS if not (REPO / "assets" / "models" / n / "config.json").exists()]
    if missing:
        print(f"tp: missing checkpoints {missing}")
        return 1
    count = 0 if args.dry_run else gpus()
    if count < 2:
        print(f"tp: skipped: {count} GPU(s); the TP=2 check needs 2 (plan: {', '.join(CHECKPOINTS)} at TP=1 and "
              f"TP=2, NCCL, float32, greedy over text / image / video)")
        return 0
    results = {name: compare(name) for name in CHECKPOINTS}
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    ok = all(r["ids_equal"] for r in results.values())
    print(" ".join(f"{n}: ids_equal={r['ids_equal']} gap={r['logprob_gap']:.1e} "
                   f"graphs={r['graphs_captured_rank0']} failed={r['graphs_failed_rank0']}"
                   for n, r in results.items()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
