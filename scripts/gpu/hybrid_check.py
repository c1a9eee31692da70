"""GPU check of the hybrid model path: tiny Nemotron Omni (Mamba-2 / attention / MoE, RADIO) and tiny Qwen3.5-MoE
(gated DeltaNet) greedy on CUDA float32 (Triton conv, scan and delta-rule kernels over the state pool) against the
CPU torch path, with an n=4 group forking from a snapshot. Usage: python scripts/gpu/hybrid_check.py [--json OUT];
last line: the key figures."""

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
sys.path.insert(0, str(REPO / "tests" / "models"))  # qwen3_cases imports its neighbours as top-level modules


def prompts(model: str) -> tuple[list, object]:
    """(the greedy prompts, the n=4 group's prompt) of a tiny checkpoint."""
    if model == "omni":
        from tests.models.nemotron_omni_cases import image_item, image_prompt, media_cases, request, text_ids

        ids, patches = image_prompt([(4, 6)], seed=8)
        return ([request(ids, items) for ids, _, items in media_cases().values()],
                request(ids + text_ids(30, 9), [image_item(patches, (4, 6), "grp")]))
    from qwen3_cases import chat_prompt

    return ([chat_prompt(text="def f(x): return x"), chat_prompt(image=["photo.png"]),
             chat_prompt(video=["odd7_h264_2fps.mp4"])], chat_prompt(image=["rgba.png"], text="Once upon a time " * 6))


def run(model: str, device: str) -> tuple[list, dict, float]:
    """(outputs of the greedy prompts and the n=4 group, the engine's state counters, wall seconds)."""
    from mm_infer import LLM, SamplingParams

    path = REPO / "assets" / "models" / ("tiny-nemotron-omni" if model == "omni" else "tiny-qwen3.5-moe")
    llm = LLM(str(path), device=device, dtype="float32", num_kv_blocks=256)
    greedy_prompts, group = prompts(model)
    prompts_ = greedy_prompts
    start = time.perf_counter()
    greedy = llm.generate(prompts_, SamplingParams(temperature=0.0, max_tokens=16, logprobs=0), use_tqdm=False)
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
    reports, ok = {}, True
    for model in ("omni", "qwen3.5-moe"):
        cpu, _, cpu_s = run(model, "cpu")
        gpu, stats, gpu_s = run(model, "cuda")
        same = sum(a.token_ids == b.token_ids for a, b in zip(cpu, gpu, strict=True))
        worst = max(abs(x - y) for a, b in zip(cpu, gpu, strict=True)
                    for x, y in zip(a.logprobs, b.logprobs, strict=True))
        reports[model] = {"sequences": len(cpu), "same_ids": same, "max_logprob_diff": worst, "cuda_s": gpu_s,
                          "cpu_s": cpu_s, "state_restores": stats.get("state_restores")}
        ok &= same == len(cpu) and worst < 1e-3
        if args.json:
            args.json.write_text(json.dumps(reports, indent=2))
    print("hybrid_check: " + "; ".join(
        f"{m} greedy ids CUDA = CPU {r['same_ids']}/{r['sequences']}, max |logprob diff| {r['max_logprob_diff']:.2e}, "
        f"restores {r['state_restores']}, CUDA {r['cuda_s']:.2f} s" for m, r in reports.items()))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
