#!/usr/bin/env bash
# GPU check for kernels/: the kernel tests on CUDA (no interpreter), then the kernel benchmark.
# Writes logs under $OUT when set (else ./out/gpu_check). A few minutes on an H100/H200.
set -uo pipefail
cd "$(dirname "$0")/.."
DEST=${OUT:-out}/gpu_check
mkdir -p "$DEST"
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
unset TRITON_INTERPRET MM_INFER_KERNELS

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  "$PY" -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'gpu', torch.cuda.is_available())"
} 2>&1 | tee "$DEST/env.txt"

timeout 420 "$PY" -m pytest -q tests/kernels -p no:cacheprovider --junitxml="$DEST/tests.xml" 2>&1 | tee "$DEST/tests.txt"
tests_rc=${PIPESTATUS[0]}

timeout 300 "$PY" scripts/bench_kernels.py --json "$DEST/bench.json" 2>&1 | tee "$DEST/bench.txt"
bench_rc=${PIPESTATUS[0]}

echo "gpu_check: tests rc=$tests_rc bench rc=$bench_rc (logs in $DEST)" | tee "$DEST/summary.txt"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
