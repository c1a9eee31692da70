"""GPU check: TRL 1.16's NCCL weight sync into our server (`init_communicator`, `update_model_params`), or a skip.

NCCL refuses two ranks of one communicator on the same GPU ("Duplicate GPU detected"), so TRL's trainer (rank 0,
GPU 0) and our server (rank 1, GPU 1) need a GPU each: on one GPU this prints why it skipped and exits 0. The
trainer side needs trl==1.16.0 with a CUDA build of vLLM (TRL imports vLLM's NCCL helpers): TRL_PYTHON names that
venv's python (default .peers/trl-venv/bin/python, whose vLLM is the CPU build: a skip, said so).
The server serves tiny-shapes-vl; the trainer pushes tiny-qwen2-vl's weights (same shapes, other values), then the
server's greedy ids must equal HF's with those weights, differ from before, and the weight version must move.
Usage: python scripts/peers/trl_nccl_check.py [--json OUT]   (exit 1 on a failed check, 0 on a pass or a skip)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SERVED = REPO / "assets" / "models" / "tiny-shapes-vl"
PUSHED = REPO / "assets" / "models" / "tiny-qwen2-vl"
PROMPT = "Describe a quiet street."
TRL_PYTHON = Path(os.environ.get("TRL_PYTHON", REPO / ".peers" / "trl-venv" / "bin" / "python"))
PROBE = ("import torch, trl, vllm, sys; from vllm.distributed.weight_transfer.nccl_common import trainer_init; "
         "sys.exit(0 if torch.cuda.is_available() else 3)")


def skip_reason() -> str | None:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < 2:
        return (f"{gpus} GPU(s): NCCL needs the trainer (rank 0) and the server (rank 1) on different GPUs "
                "('Duplicate GPU detected' otherwise)")
    if not TRL_PYTHON.exists():
        return f"no trainer venv at {TRL_PYTHON} (set TRL_PYTHON to a python with trl==1.16.0 and a CUDA vLLM)"
    probe = subprocess.run([str(TRL_PYTHON), "-c", PROBE], capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        return f"{TRL_PYTHON} cannot run TRL's NCCL side (rc {probe.returncode}: {probe.stderr.strip()[-300:]})"
    return None


def _two_gpus() -> tuple[str, str]:
    """The trainer's and the server's CUDA_VISIBLE_DEVICES: the first two GPUs this process sees."""
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")] if visible else [str(i) for i in range(torch.cuda.device_count())]
    return ids[0], ids[1]


def run_check() -> dict:
    from servers.openai.launch import free_port, wait_healthy

    port = free_port()
    trainer_gpu, server_gpu = _two_gpus()
    server_env = {**os.environ, "CUDA_VISIBLE_DEVICES": server_gpu, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen([sys.executable, "-m", "servers.cli", "serve", str(SERVED), "--port", str(port),
                               "--dtype", "float32", "--max-model-len", "1024",
                               "--weight-transfer-config", '{"backend": "nccl"}'],
                              cwd=REPO, env=server_env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_healthy(server, port, "mm-infer serve (nccl)", timeout_s=120)
        trainer_env = {**os.environ, "CUDA_VISIBLE_DEVICES": trainer_gpu, "HF_HUB_OFFLINE": "1"}
        trainer_env.pop("PYTHONPATH", None)
        done = subprocess.run([str(TRL_PYTHON), str(REPO / "scripts" / "peers" / "trl_nccl_driver.py"),
                               f"http://127.0.0.1:{port}", str(PUSHED), PROMPT],
                              env=trainer_env, capture_output=True, text=True, timeout=240)
        if done.returncode != 0:
            return {"ok": False, "error": f"trainer rc {done.returncode}: {done.stderr[-2000:]}"}
        got = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        server.terminate()
        server.wait(timeout=30)
    checks = {"after_equals_hf": got["after"] == got["hf"], "changed": got["after"] != got["before"],
              "version_moved": got["versions"][1] == got["versions"][0] + 1}
    return {"ok": all(checks.values()), "checks": checks, **got}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    reason = skip_reason()
    result = {"skipped": reason} if reason else run_check()
    print(json.dumps(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if reason or result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
