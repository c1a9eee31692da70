"""`mm-infer serve` flags build the right ServerConfig; the command starts a working server and stops on SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
from serve_process import start_serve, stop_serve
from server_cases import CKPT

from mm_infer.config import EngineConfig
from servers.cli import build_parser, engine_options, parse_args, server_config
from servers.openai.launch import free_port
from servers.vllm_flags import FlagError


def serve(*flags: str):
    return parse_args(["serve", str(CKPT), *flags])


def test_serve_arguments_parse():
    args = build_parser().parse_args(["serve", str(CKPT), "--port", "9", "--api-key", "k", "--allowed-media-path",
                                      "/a", "--allowed-media-path", "/b", "--max-model-len", "512",
                                      "--tool-parser", "hermes"])
    config = server_config(args)
    assert (config.port, config.api_key, config.fetch.allowed_media_paths) == (9, "k", (Path("/a"), Path("/b")))
    assert (config.engine_options["max_model_len"], config.tool_parser) == (512, "hermes")
    assert build_parser().parse_args(["generate", str(CKPT)]).command == "generate"


def test_engine_flags_reach_the_engine_config():
    args = serve("--kv-cache-memory-bytes", "2GiB", "--batch-invariant", "--gpu-memory-utilization", "0.5",
                 "--max-num-batched-tokens", "1024", "--enforce-eager", "--block-size", "32", "--seed", "7",
                 "--long-prefill-token-threshold", "512", "--state-snapshots", "5")
    config = EngineConfig.from_options(str(CKPT), **engine_options(args))
    assert config.cache.state_snapshots == 5
    assert (config.cache.kv_cache_memory_bytes, config.cache.gpu_memory_utilization) == (2 * 2**30, 0.5)
    assert config.batch_invariant and config.enforce_eager and config.scheduler.max_num_batched_tokens == 1024
    assert (config.cache.block_size, config.seed, config.scheduler.long_prefill_token_threshold) == (32, 7, 512)
    assert engine_options(serve()) == {}


def test_every_server_flag_reaches_the_server_config():
    """server_config (split out of run_serve) must carry every flag, not only the engine's."""
    config = server_config(serve(
        "--host", "0.0.0.0", "--served-model-name", "m", "--max-body-bytes", "5", "--reasoning-parser", "qwen3",
        "--replicas", "2", "--ray-address", "r:1", "--allow-private-media-urls", "--media-fetch-timeout", "3",
        "--max-media-bytes", "6", "--max-pixels", "100", "--video-max-pixels", "200", "--max-video-frames", "8",
        "--max-sequences-per-request", "4", "--metrics-public", "--body-timeout", "1", "--header-timeout", "2",
        "--shutdown-timeout", "3", "--allowed-weights-path", "/w"))
    assert (config.host, config.model_name, config.max_body_bytes, config.reasoning_parser) == ("0.0.0.0", "m", 5,
                                                                                               "qwen3")
    assert (config.replicas, config.ray_address, config.fetch.allow_private_urls) == (2, "r:1", True)
    assert (config.fetch.timeout_s, config.fetch.max_bytes) == (3.0, 6)
    assert (config.caps.image_max_pixels, config.caps.video_max_pixels, config.caps.max_video_frames) == (100, 200, 8)
    assert (config.max_sequences_per_request, config.metrics_public) == (4, True)
    assert (config.body_timeout_s, config.header_timeout_s, config.shutdown_timeout_s) == (1.0, 2.0, 3.0)
    assert config.allowed_weights_paths == (Path("/w"),)
    assert server_config(serve()).allowed_weights_paths is None


def test_template_and_grammar_limits_reach_their_configs():
    args = serve("--template-workers", "3", "--template-timeout", "1.5", "--max-grammar-bytes", "64K",
                 "--grammar-timeout", "7", "--grammar-cache-bytes", "32M")
    templates = server_config(args).templates
    assert (templates.workers, templates.timeout_s) == (3, 1.5)
    structured = EngineConfig.from_options(str(CKPT), **engine_options(args)).structured
    assert (structured.max_grammar_bytes, structured.grammar_timeout_s) == (64 << 10, 7.0)
    assert structured.grammar_cache_bytes == 32 << 20
    for bad in (("--template-workers", "0"), ("--template-timeout", "0")):
        with pytest.raises(FlagError, match="--template-workers must be at least 1"):
            server_config(serve(*bad))


def test_api_key_from_the_flag_then_our_variable_then_vllms(monkeypatch):
    """The key was read from $MM_INFER_API_KEY when the parser was built, and $VLLM_API_KEY never."""
    monkeypatch.delenv("MM_INFER_API_KEY", raising=False)
    monkeypatch.setenv("VLLM_API_KEY", "v")
    assert server_config(serve()).api_key == "v"
    monkeypatch.setenv("MM_INFER_API_KEY", "m")
    assert server_config(serve()).api_key == "m"
    assert server_config(serve("--api-key", "k")).api_key == "k"
    monkeypatch.delenv("MM_INFER_API_KEY")
    monkeypatch.delenv("VLLM_API_KEY")
    assert server_config(serve()).api_key is None


def test_serve_subprocess_answers_and_stops():
    proc, base = start_serve([str(CKPT), "--api-key", "k", "--max-model-len", "256", "--num-kv-blocks", "32"],
                             free_port(), timeout_s=120)
    try:
        models = httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer k"}).json()
        assert models["data"][0]["max_model_len"] == 256
        assert httpx.get(f"{base}/v1/models").status_code == 401
    finally:
        printed = stop_serve(proc, timeout_s=30)
    assert proc.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a graceful shutdown
    assert "half_gemm_bf16=" in printed and "cpu_capability=" in printed and "torch=" in printed  # what ran
