"""Accuracy per task on a held-out synthetic shapes set, through HF, the offline engine or an OpenAI server.

Usage:
  python scripts/demo/eval_accuracy.py --offline assets/models/tiny-shapes-vl          # mm_infer.LLM.generate
  python scripts/demo/eval_accuracy.py --hf assets/models/tiny-shapes-vl               # transformers (reference)
  python scripts/demo/eval_accuracy.py --url http://127.0.0.1:8000                     # `mm-infer serve` chat API
  python scripts/demo/eval_accuracy.py --offline M --hf M     # both, plus how often their token ids agree

Greedy decoding, short max_tokens. The held-out set uses --seed (default 1000; training uses 0).
Images are sent to the server as PNG data URLs, videos as lossless PNG-in-QuickTime data URLs (2 fps, so
the server's frame sampler keeps every frame and its pixels equal the offline run's).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from mm_infer.data import IMAGE_TASKS, TASKS, Sample, make_split  # noqa: E402
from mm_infer.data.answerers import Answer, HFAnswerer, OfflineAnswerer, OpenAIAnswerer, normalize  # noqa: E402


def score(samples: list[Sample], answers: list[Answer]) -> dict[str, float]:
    """Exact-match accuracy (after trimming case, spaces and a final full stop) per task, images and video."""
    hits: dict[str, list[bool]] = defaultdict(list)
    for s, a in zip(samples, answers, strict=True):
        ok = normalize(a.text) == s.answer
        hits[s.task].append(ok)
        hits["image" if s.task in IMAGE_TASKS else "video"].append(ok)
        hits["all"].append(ok)
    return {k: 100.0 * sum(v) / len(v) for k, v in hits.items()}


def report(name: str, acc: dict[str, float], seconds: float) -> None:
    order = [t for t in (*TASKS, "image", "video", "all") if t in acc]
    print(f"{name:8s} " + "  ".join(f"{k} {acc[k]:5.1f}%" for k in order) + f"   ({seconds:.1f}s)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--offline", metavar="MODEL_DIR", help="score mm_infer.LLM on this checkpoint")
    p.add_argument("--hf", metavar="MODEL_DIR", help="score HF transformers generate on this checkpoint")
    p.add_argument("--url", help="score an OpenAI-compatible server (base URL, with or without /v1)")
    p.add_argument("--model", help="model name for --url (default: the first of /v1/models)")
    p.add_argument("--api-key")
    p.add_argument("--per-task", type=int, default=100, help="held-out samples per task")
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    if not (args.offline or args.hf or args.url):
        p.error("give at least one of --offline, --hf, --url")
    samples = make_split(args.seed, args.per_task, tuple(args.tasks))
    print(f"{len(samples)} held-out samples (seed {args.seed}): {args.per_task} per task", flush=True)
    backends = []
    if args.offline:
        backends.append(("offline", lambda: OfflineAnswerer(args.offline)))
    if args.hf:
        backends.append(("hf", lambda: HFAnswerer(args.hf)))
    if args.url:
        backends.append(("url", lambda: OpenAIAnswerer(args.url, args.model, args.api_key)))
    results: dict[str, dict[str, float]] = {}
    answers: dict[str, list[Answer]] = {}
    for name, make in backends:
        answerer = make()
        start = time.perf_counter()
        answers[name] = answerer.answer(samples, args.max_tokens)
        results[name] = score(samples, answers[name])
        report(name, results[name], time.perf_counter() - start)
    names = list(answers)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if any(x.token_ids is None for x in answers[a] + answers[b]):
                continue
            same = sum(x.token_ids == y.token_ids for x, y in zip(answers[a], answers[b], strict=True))
            print(f"{a} vs {b}: identical greedy token ids on {same}/{len(samples)} samples")
            results[f"{a}_vs_{b}"] = {"identical_token_ids": 100.0 * same / len(samples)}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
