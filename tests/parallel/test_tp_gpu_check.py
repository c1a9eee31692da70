"""scripts/gpu/tp_check.py on a machine without 2 GPUs: its imports and files check out, and it skips cleanly
(exit 0, the plan printed), so gpu_check.sh never loses its window to it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_tp_gpu_check_dry_run_skips_cleanly_with_its_plan():
    run = subprocess.run([sys.executable, "scripts/gpu/tp_check.py", "--dry-run"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "tp: skipped: 0 GPU(s)" in run.stdout and "tiny-qwen3-vl-moe" in run.stdout
    assert "scripts/gpu/tp_check.py" in (REPO / "scripts" / "gpu" / "stages.py").read_text()
