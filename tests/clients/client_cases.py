"""The real RL clients' side venvs (.peers/, built by scripts/setup_client_venvs.sh), how to run them, and the case."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SETUP = "bash scripts/setup_client_venvs.sh"
TRL_PYTHON = REPO / ".peers" / "trl-venv" / "bin" / "python"
NEMO_PYTHON = REPO / ".peers" / "nemo-gym-venv" / "bin" / "python"
CKPT = REPO / "assets" / "models" / "tiny-shapes-vl"
IMAGE = REPO / "assets" / "media" / "shapes" / "colour_example.png"
MODEL = CKPT.name


def image_url(path: Path = IMAGE) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def _missing(python: Path, package: str) -> str | None:
    if not python.exists():
        return f"{python.relative_to(REPO)} is missing: build it with `{SETUP}`"
    probe = subprocess.run([str(python), "-c", f"import importlib.util, sys; "
                            f"sys.exit(0 if importlib.util.find_spec('{package}') else 1)"], capture_output=True)
    return None if probe.returncode == 0 else f"{python.relative_to(REPO)} has no `{package}`: rerun `{SETUP}`"


def needs_venv(python: Path, package: str) -> pytest.MarkDecorator:
    """Skip, naming the venv and the command that builds it, when the client is not installed."""
    reason = _missing(python, package)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def run_driver(python: Path, script: str, args: list[str], timeout_s: float = 600.0) -> tuple[dict[str, Any], float]:
    """Run tests/clients/SCRIPT in the side venv; it prints one JSON object as its last stdout line."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONPATH", None)  # the side venv must not see the project's packages
    start = time.perf_counter()
    proc = subprocess.run([str(python), str(HERE / script), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout_s)
    seconds = time.perf_counter() - start
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"{script} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n" \
                                           f"{proc.stderr[-5000:]}"
    return json.loads(lines[-1]), seconds
