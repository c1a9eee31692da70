"""`mm-infer serve` starts a working server in its own process and stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
from server_cases import CKPT, REPO

from mm_infer.cli import build_parser
from servers.openai.launch import free_port


def test_serve_arguments_parse():
    args = build_parser().parse_args(["serve", str(CKPT), "--port", "9", "--api-key", "k", "--allowed-media-path",
                                      "/a", "--allowed-media-path", "/b", "--max-model-len", "512",
                                      "--tool-parser", "hermes"])
    assert (args.port, args.api_key, args.allowed_media_path, args.max_model_len) == (9, "k", ["/a", "/b"], 512)
    assert build_parser().parse_args(["generate", str(CKPT)]).command == "generate"


def test_serve_subprocess_answers_and_stops():
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "mm_infer.cli", "serve", str(CKPT), "--port", str(port),
                             "--api-key", "k", "--max-model-len", "256", "--num-kv-blocks", "32"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.2)
        models = httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer k"}).json()
        assert models["data"][0]["max_model_len"] == 256
        assert httpx.get(f"{base}/v1/models").status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a graceful shutdown
