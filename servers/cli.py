"""The `mm-infer` console command: the library's sub-commands plus `serve` (the OpenAI-compatible server)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from mm_infer import cli as library_cli
from servers.openai.config import FetchConfig, MediaCaps, ServerConfig
from servers.openai.launch import serve

ENGINE_FLAGS = ("dtype", "max_model_len", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens", "seed",
                "kv_cache_memory_bytes", "gpu_memory_utilization", "device")


def engine_options(args: argparse.Namespace) -> dict[str, object]:
    """The engine options the serve flags set (unset flags leave the engine's defaults)."""
    engine: dict[str, object] = {k: getattr(args, k) for k in ENGINE_FLAGS if getattr(args, k) is not None}
    for flag in ("batch_invariant", "enforce_eager"):
        if getattr(args, flag):
            engine[flag] = True
    return engine


def run_serve(args: argparse.Namespace) -> int:
    engine = engine_options(args)
    config = ServerConfig(
        model_dir=args.model, served_model_name=args.served_model_name, host=args.host, port=args.port,
        api_key=args.api_key, max_body_bytes=args.max_body_bytes, reasoning_parser=args.reasoning_parser,
        tool_parser=args.tool_parser, engine_options=engine, replicas=args.replicas, ray_address=args.ray_address,
        fetch=FetchConfig(allowed_media_paths=tuple(Path(p) for p in args.allowed_media_path),
                          allow_private_urls=args.allow_private_media_urls, timeout_s=args.media_fetch_timeout,
                          max_bytes=args.max_media_bytes),
        caps=MediaCaps(image_max_pixels=args.max_pixels, video_max_pixels=args.video_max_pixels,
                       max_video_frames=args.max_video_frames),
        max_sequences_per_request=args.max_sequences_per_request, metrics_public=args.metrics_public,
        body_timeout_s=args.body_timeout, header_timeout_s=args.header_timeout,
        shutdown_timeout_s=args.shutdown_timeout,
        allowed_weights_paths=tuple(Path(p) for p in args.allowed_weights_path) or None)
    serve(config, args.log_level)
    return 0


def add_serve(sub: argparse._SubParsersAction) -> None:
    srv = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    srv.add_argument("model", help="checkpoint folder in Hugging Face format")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--api-key", default=os.environ.get("MM_INFER_API_KEY"),
                     help="require Authorization: Bearer <key> (default: $MM_INFER_API_KEY)")
    srv.add_argument("--served-model-name", default=None)
    srv.add_argument("--allowed-media-path", action="append", default=[], help="folder file:// URLs may read")
    srv.add_argument("--allow-private-media-urls", action="store_true", help="allow http(s) to private addresses")
    srv.add_argument("--media-fetch-timeout", type=float, default=10.0,
                     help="wall-clock seconds for one whole media download (connect, headers and body)")
    srv.add_argument("--max-media-bytes", type=int, default=64 * 1024 * 1024)
    srv.add_argument("--max-body-bytes", type=int, default=100 * 1024 * 1024)
    srv.add_argument("--max-model-len", type=int, default=None)
    srv.add_argument("--num-kv-blocks", type=int, default=None)
    srv.add_argument("--max-num-seqs", type=int, default=None)
    srv.add_argument("--max-num-batched-tokens", type=int, default=None, help="token budget of one engine step")
    srv.add_argument("--kv-cache-memory-bytes", default=None, help="KV pool size, e.g. 4GiB (default: on CUDA from "
                     "--gpu-memory-utilization, on CPU 256MiB)")
    srv.add_argument("--gpu-memory-utilization", type=float, default=None,
                     help="fraction of the GPU this engine may use, KV pool included (default 0.9)")
    srv.add_argument("--batch-invariant", action="store_true",
                     help="a request's tokens and logprobs identical alone or in any batch (slower on CPU)")
    srv.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs for decode steps")
    srv.add_argument("--device", default=None, help="auto, cpu, cuda or cuda:N")
    srv.add_argument("--max-pixels", type=int, default=None, help="image max_pixels cap (default: checkpoint)")
    srv.add_argument("--video-max-pixels", type=int, default=None)
    srv.add_argument("--max-video-frames", type=int, default=768)
    srv.add_argument("--reasoning-parser", default=None, choices=["qwen3", "deepseek_r1", "think"])
    srv.add_argument("--tool-parser", default=None, choices=["hermes", "qwen"])
    srv.add_argument("--dtype", default=None)
    srv.add_argument("--seed", type=int, default=None)
    srv.add_argument("--replicas", type=int, default=None,
                     help="run N engine replicas as Ray actors behind a cache-aware router (default: one in-process)")
    srv.add_argument("--ray-address", default=None, help="Ray cluster to join with --replicas (default: a local Ray)")
    srv.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    _add_limit_flags(srv)
    srv.set_defaults(func=run_serve)


def _add_limit_flags(srv: argparse.ArgumentParser) -> None:
    """Per-request limits, slow-client deadlines, shutdown and what refits and /metrics may touch."""
    srv.add_argument("--max-sequences-per-request", type=int, default=256, help="prompts x n in one request")
    srv.add_argument("--metrics-public", action="store_true", help="/metrics and /version without the API key")
    srv.add_argument("--body-timeout", type=float, default=30.0, help="seconds for a whole request body to arrive")
    srv.add_argument("--header-timeout", type=float, default=10.0,
                     help="seconds for request headers to arrive (slow clients are cut off)")
    srv.add_argument("--shutdown-timeout", type=float, default=30.0,
                     help="on SIGTERM, seconds in-flight requests get before they end with an error")
    srv.add_argument("--allowed-weights-path", action="append", default=[],
                     help="folder /update_weights_from_disk may read (default: the model folder's parent)")


def build_parser() -> argparse.ArgumentParser:
    return library_cli.build_parser(add_serve)


def main(argv: Sequence[str] | None = None) -> int:
    return library_cli.main(argv, add_serve)


if __name__ == "__main__":
    sys.exit(main())
