#!/usr/bin/env bash
# Serving speed against vLLM's CPU build, measured by vLLM's own `vllm bench serve` (scripts/bench/serve.py).
# Usage: bash scripts/bench/serve.sh [--pairs 3] [--workloads mm,video,text] [--prompts 96] [--model DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
exec .venv/bin/python scripts/bench/serve.py "$@"
