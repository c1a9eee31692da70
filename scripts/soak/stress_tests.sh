#!/usr/bin/env bash
# Run pytest targets ROUNDS times in a row while CPU hogs load the machine (what `stress --cpu N` does), to shake
# out timing races; prints one line per round and a summary, and exits 1 if any round failed.
# usage: scripts/soak/stress_tests.sh ROUNDS HOGS pytest-args...
#   e.g. scripts/soak/stress_tests.sh 10 2 tests/servers tests/distributed
set -u
rounds=$1; hogs=$2; shift 2
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
pids=()
for _ in $(seq "$hogs"); do "$py" -c "while True: pass" & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
failed=0
for r in $(seq "$rounds"); do
  start=$(date +%s)
  if out=$(HF_HUB_OFFLINE=1 "$py" -m pytest -q -p no:cacheprovider "$@" 2>&1); then status=ok; else status=FAIL; failed=$((failed + 1)); fi
  echo "round $r/$rounds: $status in $(( $(date +%s) - start ))s: $(echo "$out" | tail -1)"
  [ "$status" = FAIL ] && echo "$out" | grep -E "^(FAILED|ERROR)" | sed 's/^/    /'
done
echo "stress: $failed of $rounds rounds failed under $hogs CPU hogs: $*"
[ "$failed" -eq 0 ]
