"""The GPU check's Python side (run by scripts/gpu_check.sh): kernel timings, CPU/CUDA parity, decode vs HBM."""
