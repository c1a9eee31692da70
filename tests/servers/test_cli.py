"""`mm-infer serve` starts a working server in its own process and stops on SIGTERM."""

from __future__ import annotations

import signal

import httpx
from serve_process import start_serve, stop_serve
from server_cases import CKPT

from servers.cli import build_parser
from servers.openai.launch import free_port


def test_serve_arguments_parse():
    args = build_parser().parse_args(["serve", str(CKPT), "--port", "9", "--api-key", "k", "--allowed-media-path",
                                      "/a", "--allowed-media-path", "/b", "--max-model-len", "512",
                                      "--tool-parser", "hermes"])
    assert (args.port, args.api_key, args.allowed_media_path, args.max_model_len) == (9, "k", ["/a", "/b"], 512)
    assert build_parser().parse_args(["generate", str(CKPT)]).command == "generate"


def test_serve_subprocess_answers_and_stops():
    proc, base = start_serve([str(CKPT), "--api-key", "k", "--max-model-len", "256", "--num-kv-blocks", "32"],
                             free_port(), timeout_s=120)
    try:
        models = httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer k"}).json()
        assert models["data"][0]["max_model_len"] == 256
        assert httpx.get(f"{base}/v1/models").status_code == 401
    finally:
        stop_serve(proc, timeout_s=30)
    assert proc.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a graceful shutdown
