"""GPU check of the hybrid model path: tiny Nemotron Omni (Mamba-2 / attention / MoE, RADIO) greedy on CUDA float32
(Triton conv and scan kernels over the state pool) against the CPU torch path, with an n=4 group forking from a
snapshot. Usage: python scripts/gpu/hybrid_check.py [--json OUT]; last line: the key figures."""

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


def run(device: str) -> tuple[list, dict, float]:
    """(outputs of the greedy prompts and the n=4 group, the engine's state counters, wall seconds)."""
    from mm_infer import LLM, SamplingParams
    from tests.models.nemotron_omni_cases import OMNI, image_item, image_prompt, media_cases, request, text_ids

    llm = LLM(str(OMNI), device=device, dtype="float32", num_kv_blocks=256)
    prompts = [request(ids, items) for ids, _, items in media_cases().values()]
    ids, patches = image_prompt([(4, 6)], seed=8)
    group = request(ids + text_ids(30, 9), [image_item(patches, (4, 6), "grp")])
    start = time.perf_counter()
    greedy = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=16, logprobs=0), use_tqdm=False)
    forked = llm.generate([group], SamplingParams(n=4, temperature=0.0, max_tokens=8, logprobs=0), use_tqdm=False)
    seconds = time.perf_counter() - start
    outs = [o.outputs[0] for o in greedy] + list(forked[0].outputs)
    return outs, llm.engine.stats(), seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("hybrid_check: skipped: no CUDA")
        return
    cpu, _, cpu_s = run("cpu")
    gpu, stats, gpu_s = run("cuda")
    same = sum(a.token_ids == b.token_ids for a, b in zip(cpu, gpu, strict=True))
    worst = max(abs(x - y) for a, b in zip(cpu, gpu, strict=True) for x, y in zip(a.logprobs, b.logprobs, strict=True))
    report = {"sequences": len(cpu), "same_ids": same, "max_logprob_diff": worst, "cuda_s": gpu_s, "cpu_s": cpu_s,
              "state_restores": stats.get("state_restores"), "kernels": "triton" if torch.cuda.is_available() else ""}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    print(f"hybrid_check: greedy ids CUDA = CPU {same}/{len(cpu)}, max |logprob diff| {worst:.2e}, "
          f"restores {report['state_restores']}, CUDA {gpu_s:.2f} s, CPU {cpu_s:.2f} s")
    sys.exit(0 if same == len(cpu) and worst < 1e-3 else 1)


if __name__ == "__main__":
    main()
