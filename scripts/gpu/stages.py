"""The GPU check's stage runner: stages in the order that matters, each with its own timeout, inside one overall
budget (a stage whose timeout no longer fits is skipped and says so). Each stage's figures go into one
results.json, rewritten after every stage, and all output into one log; the last line carries the key figures.
`--dry-run` prints the plan and checks, with the packages the GPU machine lacks blocked, that every stage's script
imports and finds its files (the engine, hybrid and TP stages run their CPU forms).
Usage: python scripts/gpu/stages.py OUTDIR [--dry-run] [--budget S]"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUDGET_S = 530  # the one command's limit is 10 minutes and the check's 9: leave the wrapper its seconds
# packages the GPU machine's image lacks (.library/device/KINDS.md); no stage may need them
MISSING_THERE = ("av", "xgrammar", "orjson", "pydantic", "fastapi", "uvicorn", "decord")


@dataclass(frozen=True)
class Stage:
    """One stage: its command ({py}: the interpreter, {json}: where it writes its figures), its timeout, how
    many GPUs it needs, and the script whose imports and files the dry run checks."""

    name: str
    command: tuple[str, ...]
    timeout_s: int
    gpus: int = 1
    script: str | None = None
    why: str = ""
    dry: tuple[str, ...] = ()  # the dry run's check on a CPU (default: import the script without running it)
    extra_env: dict[str, str] = field(default_factory=dict)


ENV_PROBE = ("import torch, triton, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', "
             "triton.__version__, 'gpus', torch.cuda.device_count(), 'gpu', torch.cuda.get_device_name() if "
             "torch.cuda.is_available() else None); sys.exit(0 if torch.cuda.is_available() else 3)")

STAGES = (
    Stage("env", ("{py}", "-c", ENV_PROBE), 25, why="versions, and whether CUDA is there at all"),
    Stage("compile_sm90", ("{py}", "scripts/gpu/compile_sm90.py", "--json", "{json}"), 45,
          script="scripts/gpu/compile_sm90.py", why="registers and spills of every kernel with this machine's Triton"),
    Stage("kernels", ("{py}", "scripts/gpu/bench_kernels.py", "--json", "{json}"), 80,
          script="scripts/gpu/bench_kernels.py", why="paged decode/prefill, patch embed, rope at real shapes"),
    Stage("engine", ("{py}", "scripts/gpu/engine_check.py", "--budget", "110", "--json", "{json}"), 150,
          script="scripts/gpu/engine_check.py",
          why="CPU/CUDA parity on every tiny Qwen family (MoE included), graphs captured, 7B-shaped decode",
          dry=("{py}", "scripts/gpu/engine_check.py", "--device", "cpu", "--quick", "--sections", "group")),
    Stage("hybrid", ("{py}", "scripts/gpu/hybrid_check.py", "--json", "{json}"), 40,
          script="scripts/gpu/hybrid_check.py", why="Nemotron Omni and Qwen3.5-MoE on CUDA against the CPU",
          dry=("{py}", "-c", "import runpy; m = runpy.run_path('scripts/gpu/hybrid_check.py', run_name='dry_run'); "
                             "m['prompts']('omni'); m['prompts']('qwen')")),
    Stage("tp", ("{py}", "scripts/gpu/tp_check.py", "--json", "{json}"), 90, gpus=2, script="scripts/gpu/tp_check.py",
          why="TP=2 over NCCL against TP=1", dry=("{py}", "scripts/gpu/tp_check.py", "--dry-run")),
    Stage("trl_nccl", ("{py}", "scripts/peers/trl_nccl_check.py", "--json", "{json}"), 400, gpus=2,
          script="scripts/peers/trl_nccl_check.py", why="TRL's NCCL weight sync into our server (needs TRL_PYTHON)"),
    Stage("vision_attention", ("{py}", "scripts/bench/vision_attention.py", "--layers", "8"), 25,
          script="scripts/bench/vision_attention.py", why="window attention: per-window SDPA against flash varlen"),
    Stage("kernel_tests", ("{py}", "-m", "pytest", "-q", "tests/kernels", "-p", "no:cacheprovider"), 145,
          why="the kernel test suite on CUDA (no interpreter), last"),
)


def plan(gpus: int, budget_s: float) -> list[tuple[Stage, str]]:
    """(stage, what happens to it) in order: run, or skipped for GPUs or for the budget."""
    out, left = [], budget_s
    for stage in STAGES:
        if gpus < stage.gpus:
            out.append((stage, f"skipped: {gpus} GPU(s), needs {stage.gpus}"))
        elif stage.timeout_s > left:
            out.append((stage, f"skipped: its {stage.timeout_s} s no longer fit the budget ({left:.0f} s left)"))
        else:
            out.append((stage, "run"))
            left -= stage.timeout_s
    return out


def _command(stage: Stage, json_path: Path) -> list[str]:
    return [part.replace("{py}", sys.executable).replace("{json}", str(json_path)) for part in stage.command]


def run_stage(stage: Stage, log: object, scratch: Path) -> dict:
    """Run one stage under its timeout, its output teed into the log; its result record."""
    json_path = scratch / f"{stage.name}.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **stage.extra_env}
    env.pop("TRITON_INTERPRET", None)
    start = time.monotonic()
    log.write(f"\n===== {stage.name} (timeout {stage.timeout_s} s): {' '.join(stage.command)}\n")
    log.flush()
    try:
        proc = subprocess.run(_command(stage, json_path), cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=stage.timeout_s)
        rc, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, output = 124, f"{exc.stdout or ''}{exc.stderr or ''}\n[timed out after {stage.timeout_s} s]"
        output = output if isinstance(output, str) else output.decode(errors="replace")
    log.write(output)
    log.flush()
    figures = json.loads(json_path.read_text()) if json_path.exists() else None
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return {"rc": rc, "seconds": round(time.monotonic() - start, 1), "figures": figures,
            "last_line": lines[-1] if lines else ""}


def key_figures(results: dict) -> str:
    """The last line: each stage's outcome and its own last line, shortened."""
    parts = []
    for name, res in results.items():
        if "skipped" in res:
            parts.append(f"{name}=skipped")
        else:
            parts.append(f"{name}={'ok' if res['rc'] == 0 else 'rc' + str(res['rc'])}[{res['last_line'][:90]}]")
    return "gpu_check: " + " | ".join(parts)


def dry_run(budget_s: float) -> int:
    """The plan for a one-GPU machine, then every stage's script imported (not run) with MISSING_THERE blocked, and
    the kernel tests collected the same way."""
    for stage, fate in plan(1, budget_s):
        print(f"{stage.name:17s} {stage.timeout_s:4d} s  {fate:12s} {stage.why}")
    print(f"budget {budget_s:.0f} s; worst case with one GPU "
          f"{sum(s.timeout_s for s, f in plan(1, budget_s) if f == 'run')} s")
    with tempfile.TemporaryDirectory() as blockdir:
        Path(blockdir, "sitecustomize.py").write_text(
            "import importlib.abc, sys\n"
            f"BLOCKED = {set(MISSING_THERE)!r}\n"
            "class _Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] in BLOCKED:\n"
            "            raise ImportError(f'{name} is not on the GPU machine')\n"
            "sys.meta_path.insert(0, _Block())\n")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([blockdir, str(REPO)]), "HF_HUB_OFFLINE": "1"}
        failed = 0
        for stage in STAGES:
            if stage.dry:
                check = _command(Stage(stage.name, stage.dry, stage.timeout_s), Path(blockdir) / "dry.json")
            elif stage.script:
                check = [sys.executable, "-c", f"import runpy; runpy.run_path({stage.script!r}, run_name='dry_run')"]
            elif stage.name == "kernel_tests":
                check = [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/kernels", "-p",
                         "no:cacheprovider"]
            else:
                continue
            proc = subprocess.run(check, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
            ok = proc.returncode == 0
            failed += not ok
            what = "ran on the CPU" if stage.dry else "imports ok"
            print(f"dry run {stage.name}: {what if ok else 'FAILED: ' + (proc.stderr or proc.stdout)[-600:]}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--budget", type=float, default=BUDGET_S)
    args = parser.parse_args()
    if args.dry_run:
        return dry_run(args.budget)
    args.outdir.mkdir(parents=True, exist_ok=True)
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    results: dict = {}
    with (args.outdir / "gpu_check.log").open("w") as log, tempfile.TemporaryDirectory() as scratch:
        for stage, fate in plan(gpus, args.budget):
            results[stage.name] = run_stage(stage, log, Path(scratch)) if fate == "run" else {"skipped": fate}
            (args.outdir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
            print(f"{stage.name}: {results[stage.name].get('rc', fate)}", flush=True)
            if stage.name == "env" and results["env"].get("rc", 1) != 0:
                break  # no CUDA: nothing else can run
    print(key_figures(results))
    return 0 if all(r.get("rc", 0) == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
