#!/usr/bin/env bash
# GPU check: one command, at most 9 minutes (scripts/gpu/stages.py): the environment, real-shape kernel benchmarks,
# engine CPU/CUDA parity on every tiny Qwen family with 7B-shaped decode, the hybrid models, TP=2 (2+ GPUs), vision
# attention, and the kernel test suite last; each stage under its own timeout, inside a 530 s budget. Writes two
# files: OUTDIR/results.json (every stage's figures, rewritten after each) and OUTDIR/gpu_check.log; the last line
# printed carries the key figures. Exits 3 at once without CUDA.
# Usage: bash scripts/gpu_check.sh [OUTDIR] [--dry-run]   (default OUTDIR: $OUT/gpu_check, else ./out/gpu_check)
# --dry-run (any machine): prints the stage plan with its budget, and checks with the GPU machine's missing packages
# blocked that every stage imports and finds its files (the engine, hybrid and TP stages run their CPU forms).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${1:-${OUT:-out}/gpu_check}
cd "$ROOT"
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
unset TRITON_INTERPRET MM_INFER_KERNELS
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
if [ "${2:-}" != "--dry-run" ] && ! timeout -k 2 20 "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "gpu_check: CUDA is not available to $PY; nothing run (--dry-run checks the plan on any machine)" >&2
  exit 3
fi
exec "$PY" scripts/gpu/stages.py "$DEST" "${@:2}"
