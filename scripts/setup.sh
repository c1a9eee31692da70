#!/usr/bin/env bash
# Creates .venv and installs mm-infer with its test extra. On a machine without CUDA it takes the
# pinned CPU build of torch first (an unpinned torch would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! python -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    python -m pip install -q torch
  else
    python -m pip install -q "torch==2.13.0"
  fi
fi
python -m pip install -q -e ".[test]"
