"""Engine-level GPU check: CPU/CUDA greedy parity on every tiny Qwen family (MoE included) with the decode graphs each
engine captured, seeded n=8 groups, sampler timing, 7B-shaped decode vs HBM floor. Every engine's KV pool is bounded
and it is closed (its memory released) before the next one starts."""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the checkout: `scripts.*` imports as a package

from scripts.gpu.check_common import Report, graph_counts, median_ms, say  # noqa: E402
from scripts.gpu.decode_check import decode_bench  # noqa: E402

MODELS = [REPO / "assets" / "models" / name for name in ("tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl",
                                                           "tiny-qwen3-vl-moe")]
BOUNDED = {"num_kv_blocks": 512, "max_model_len": 2048}  # a tiny model at 0.9 utilisation would take ~131 GB of KV
IMAGE = str(REPO / "assets" / "media" / "shapes" / "colour_example.png")


def prompts() -> list[dict[str, Any]]:
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}]
    return [{"prompt": "The quick brown fox"}, {"prompt": "one two three"}, {"prompt": "Score these prompt tokens"},
            {"messages": chat, "multi_modal_data": {"image": [IMAGE]}}]


GRAPHS: dict[str, list[int]] = {}  # "model device dtype" -> [decode graphs captured, captures that failed]


def generate(model_dir: Path, device: str, dtype: str, params: Any) -> list[Any]:
    """The prompts' outputs from a bounded engine, closed at the end; its decode graphs are counted in GRAPHS."""
    from mm_infer import LLM

    with LLM(str(model_dir), device=device, dtype=dtype, **BOUNDED) as llm:
        outs = llm.generate(prompts(), params, use_tqdm=False)
        GRAPHS[f"{model_dir.name} {device} {dtype}"] = graph_counts(llm)
    return outs


def logprob_gap(a: Any, b: Any) -> float:
    """Max |logprob difference| of two samples up to and including their first differing token."""
    n = min(len(a.token_ids), len(b.token_ids))
    same = next((i for i in range(n) if a.token_ids[i] != b.token_ids[i]), n)
    return max((abs(x - y) for x, y in zip(a.logprobs[:same + 1], b.logprobs[:same + 1], strict=False)), default=0.0)


def parity(device: str) -> Report:
    """Greedy fp32 on CPU vs on `device` (ids equal, max |logprob diff|), then bf16 on `device` end to end."""
    from mm_infer import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    out: Report = {"ok": True}
    for model in MODELS:
        ref = generate(model, "cpu", "float32", params)
        got = generate(model, device, "float32", params)
        pairs = [(r.outputs[0], g.outputs[0]) for r, g in zip(ref, got, strict=True)]
        equal = sum(a.token_ids == b.token_ids for a, b in pairs)
        diff = max(logprob_gap(a, b) for a, b in pairs)
        bf16 = generate(model, device, "bfloat16", params)
        tokens = sum(len(o.outputs[0].token_ids) for o in bf16)
        agree = sum(o.outputs[0].token_ids == r.outputs[0].token_ids for o, r in zip(bf16, ref, strict=True))
        res = {"prompts": len(ref), "fp32_ids_equal": equal, "fp32_max_abs_logprob_diff": diff,
               "bf16_tokens": tokens, "bf16_prompts_equal_to_fp32": agree,
               "graphs_captured_failed": {k: v for k, v in GRAPHS.items() if k.startswith(model.name + " ")}}
        out[model.name] = res
        out["ok"] &= equal == len(ref) and diff < 1e-3 and tokens == 24 * len(ref)
        say(f"parity {model.name} fp32 cpu vs {device}", f"ids equal {equal}/{len(ref)}, max|dlogprob| {diff:.3g}")
        say(f"parity {model.name} bf16 {device}", f"ran, {tokens} tokens, {agree}/{len(ref)} prompts equal fp32 ids")
    return out


def group(device: str) -> Report:
    """n=8 temperature-1 group twice with seed 0: distinct samples and same-seed reproducibility."""
    from mm_infer import LLM, SamplingParams

    params = SamplingParams(n=8, temperature=1.0, top_p=0.95, seed=0, max_tokens=32)
    with LLM(str(MODELS[0]), device=device, dtype="float32", **BOUNDED) as llm:
        runs = [[tuple(c.token_ids) for c in llm.generate([prompts()[3]], params, use_tqdm=False)[0].outputs]
                for _ in range(2)]
    distinct, same = len(set(runs[0])), runs[0] == runs[1]
    say(f"group n=8 T=1 {device}", f"ran, {distinct}/8 distinct samples, same seed reproduces ids: {same}")
    return {"ok": same and len(runs[0]) == 8, "samples": len(runs[0]), "distinct": distinct, "reproducible": same}


def make_seq(seed: int, prompt: list[int], output: list[int], **kw: Any) -> Any:
    from mm_infer import SamplingParams
    from mm_infer.engine.scheduling.sequence import Sequence, SequenceGroup

    grp = SequenceGroup("r", SamplingParams(seed=seed, **kw), SimpleNamespace(placeholders=[], item_patches=[]))
    seq = Sequence(grp, prompt)
    seq.token_ids += output
    seq.seed = seed
    return seq


SAMPLER_CASES: dict[str, list[dict[str, Any]]] = {
    "greedy": [dict(temperature=0.0)],
    "t1_top_p0.9_top_k50": [dict(temperature=1.0, top_p=0.9, top_k=50)],
    "mixed_penalties_logprobs5": [
        dict(temperature=0.0, logprobs=5),
        dict(temperature=1.0, top_p=0.9, top_k=50, repetition_penalty=1.1, logprobs=5),
        dict(temperature=0.7, frequency_penalty=0.3, presence_penalty=0.2, logprobs=5),
        dict(temperature=1.0, min_p=0.05, repetition_penalty=1.05, logprobs=5, logprobs_mode="processed_logprobs"),
    ],
}


def sampler_bench(device: str, quick: bool) -> Report:
    """Sampler.sample + readback per step at [rows, vocab] float32 logits, per row mix; median ms."""
    from mm_infer.engine.sampling.sampler import Sampler

    rows, vocab = (8, 4096) if quick else (256, 152064)
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(rows, vocab, generator=gen) * 4).to(device)
    sampler = Sampler(never_sample=[vocab - 2, vocab - 1], eos_ids=[vocab - 3])
    out: Report = {"ok": True, "rows": rows, "vocab": vocab}
    for name, kinds in SAMPLER_CASES.items():
        seqs = [make_seq(i, torch.randint(0, vocab, (512,), generator=gen).tolist(),
                         torch.randint(0, vocab, (64,), generator=gen).tolist(), **kinds[i % len(kinds)])
                for i in range(rows)]
        ms = median_ms(lambda x, s=seqs: sampler.sample(x, s).readback(), device, setup=logits.clone)
        out[name] = ms
        say(f"sampler {rows}x{vocab} {name}", f"{ms:.2f} ms/step")
    return out


def run_section(name: str, fn: Callable[[], Report], report: Report, json_path: Path | None,
                deadline: float) -> None:
    """Run one section; a failure is recorded (and printed) without stopping the others; JSON rewritten after."""
    start = time.monotonic()
    try:
        report[name] = fn() if start < deadline else {"ok": False, "error": "skipped: time budget spent"}
    except Exception as exc:  # noqa: BLE001 - each section reports its own failure
        traceback.print_exc()
        report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if "error" in report[name]:
        say(f"{name} FAILED", report[name]["error"])
    report[name]["seconds"] = round(time.monotonic() - start, 2)
    gc.collect()  # drop the section's engines and tensors before the next one allocates
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if json_path:
        json_path.write_text(json.dumps(report, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (runs on a CPU in well under a minute)")
    parser.add_argument("--json", type=Path, help="write every figure here (rewritten after each section)")
    parser.add_argument("--budget", type=float, default=220.0, help="seconds; later decode sizes are skipped after")
    parser.add_argument("--sections", default="parity,group,sampler,decode", help="which, comma-separated")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        say("gpu_engine_check", "CUDA requested but not available")
        return 2
    env = {"torch": torch.__version__, "device": args.device, "quick": args.quick,
           "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None}
    say("env", env)
    report: Report = {"env": env}
    sections: dict[str, Callable[[], Report]] = {
        "parity": lambda: parity(args.device),
        "group": lambda: group(args.device),
        "sampler": lambda: sampler_bench(args.device, args.quick),
        "decode": lambda: decode_bench(args.device, args.quick, deadline),
    }
    sections = {name: sections[name] for name in args.sections.split(",")}
    for name, fn in sections.items():
        run_section(name, fn, report, args.json, deadline)
    failed = [n for n in sections if not report[n].get("ok")]
    report["summary"] = {"ok": not failed, "failed": failed, "seconds": round(args.budget - deadline
                                                                                + time.monotonic(), 1)}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    say("summary", f"{'all sections ok' if not failed else 'FAILED: ' + ', '.join(failed)} "
                   f"in {report['summary']['seconds']} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
