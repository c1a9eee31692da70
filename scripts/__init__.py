"""Project scripts, one folder per concept (`scripts.<folder>.<name>` imports as a package from the checkout's root):
bench/ (figures against a peer), gpu/ (the GPU check's Python side), soak/ (long and hostile runs), assets/ (makers of
assets/: checkpoints, media, goldens), peers/ (vLLM and HF side by side: parity, the differential suite, TRL NCCL),
demo/ (GRPO loop, accuracy). setup.sh, setup_client_venvs.sh and gpu_check.sh stay at the top."""
