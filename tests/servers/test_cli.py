"""`mm-infer serve` starts a working server in its own process and stops on SIGTERM."""

from __future__ import annotations

import signal

import httpx
from serve_process import start_serve, stop_serve
from server_cases import CKPT

from mm_infer.config import EngineConfig
from servers.cli import build_parser, engine_options
from servers.openai.launch import free_port


def test_serve_arguments_parse():
    args = build_parser().parse_args(["serve", str(CKPT), "--port", "9", "--api-key", "k", "--allowed-media-path",
                                      "/a", "--allowed-media-path", "/b", "--max-model-len", "512",
                                      "--tool-parser", "hermes"])
    assert (args.port, args.api_key, args.allowed_media_path, args.max_model_len) == (9, "k", ["/a", "/b"], 512)
    assert build_parser().parse_args(["generate", str(CKPT)]).command == "generate"


def test_engine_flags_reach_the_engine_config():
    args = build_parser().parse_args(["serve", str(CKPT), "--kv-cache-memory-bytes", "2GiB", "--batch-invariant",
                                      "--gpu-memory-utilization", "0.5", "--max-num-batched-tokens", "1024",
                                      "--enforce-eager"])
    config = EngineConfig.from_options(str(CKPT), **engine_options(args))
    assert (config.cache.kv_cache_memory_bytes, config.cache.gpu_memory_utilization) == (2 * 2**30, 0.5)
    assert config.batch_invariant and config.enforce_eager and config.scheduler.max_num_batched_tokens == 1024
    assert engine_options(build_parser().parse_args(["serve", str(CKPT)])) == {}


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
