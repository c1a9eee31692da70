"""The GPU check's dry run on this CPU: the stage plan fits its budget inside the 9-minute window, every stage's
script imports and finds its files with the GPU machine's missing packages blocked (the engine, hybrid and TP stages
run their CPU forms), and the check writes at most 8 files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from scripts.gpu.stages import BUDGET_S, STAGES, plan  # noqa: E402


def test_the_plan_fits_nine_minutes_and_skips_what_one_gpu_cannot_run():
    fates = dict((s.name, fate) for s, fate in plan(1, BUDGET_S))
    assert fates["tp"].startswith("skipped: 1 GPU") and fates["trl_nccl"].startswith("skipped: 1 GPU")
    assert sum(s.timeout_s for s, fate in plan(1, BUDGET_S) if fate == "run") <= BUDGET_S <= 540
    assert [s.name for s in STAGES][0] == "env" and [s.name for s in STAGES][-1] == "kernel_tests"
    two = dict((s.name, fate) for s, fate in plan(2, BUDGET_S))
    assert two["tp"] == "run" and "budget" in two["trl_nccl"]  # a stage that no longer fits says so


def test_the_dry_run_imports_every_stage_with_the_missing_packages_blocked(tmp_path):
    run = subprocess.run(["bash", "scripts/gpu_check.sh", str(tmp_path / "out"), "--dry-run"], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert run.stdout.count("dry run ") == len(STAGES) - 1  # every stage but the env probe
    assert "FAILED" not in run.stdout and "ran on the CPU" in run.stdout


def test_a_blocked_import_fails_the_dry_run(tmp_path, monkeypatch):
    # the dry run must be able to fail: a stage script importing a package the GPU machine lacks
    script = tmp_path / "needs_av.py"
    script.write_text("import av\n")
    from scripts.gpu import stages

    monkeypatch.setattr(stages, "STAGES", (stages.Stage("probe", ("{py}", str(script)), 5, script=str(script)),))
    assert stages.dry_run(BUDGET_S) == 1
