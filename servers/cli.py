"""The `mm-infer` console command: the library's sub-commands plus `serve` (the OpenAI-compatible server)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from mm_infer import cli as library_cli
from mm_infer.prompt.template_workers import TemplateLimits
from servers.cli_flags import add_serve_flags
from servers.openai.config import FetchConfig, MediaCaps, ServerConfig
from servers.vllm_flags import FlagError, add_vllm_flags, check_tokenizer, ignored_flag_warnings, vllm_argv

ENGINE_FLAGS = ("dtype", "max_model_len", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens", "seed",
                "kv_cache_memory_bytes", "gpu_memory_utilization", "device", "block_size", "enable_prefix_caching",
                "enforce_eager", "video_sampler", "mrope_after_video", "max_grammar_bytes", "grammar_timeout_s",
                "grammar_cache_bytes", "long_prefill_token_threshold", "enable_return_routed_experts",
                "state_snapshots", "tensor_parallel_size", "tp_deterministic")
log = logging.getLogger("mm_infer.server")


def engine_options(args: argparse.Namespace) -> dict[str, object]:
    """The engine options the serve flags set (unset flags leave the engine's defaults)."""
    engine: dict[str, object] = {k: getattr(args, k) for k in ENGINE_FLAGS if getattr(args, k) is not None}
    if args.batch_invariant:
        engine["batch_invariant"] = True
    return engine


def _api_key(args: argparse.Namespace) -> str | None:
    """--api-key, else $MM_INFER_API_KEY, else $VLLM_API_KEY (vLLM's variable)."""
    keys = args.api_key or []
    if len(keys) > 1:
        raise FlagError(f"--api-key: one key is supported, got {len(keys)}")
    return (keys[0] if keys else None) or os.environ.get("MM_INFER_API_KEY") or os.environ.get("VLLM_API_KEY")


def _served_names(args: argparse.Namespace) -> tuple[str | None, tuple[str, ...]]:
    names = list(dict.fromkeys(args.served_model_name or []))
    return (names[0] if names else None), tuple(names[1:])


def _check(args: argparse.Namespace) -> None:
    """Combinations vLLM refuses, and vLLM flags whose value only the model can tell."""
    if args.enable_auto_tool_choice and not args.tool_parser:
        raise FlagError("--enable-auto-tool-choice requires --tool-call-parser")
    if args.max_logprob_entries < 1:
        raise FlagError("--max-logprob-entries must be at least 1")
    if args.template_workers < 1 or args.template_timeout <= 0:
        raise FlagError("--template-workers must be at least 1 and --template-timeout positive")
    refused = check_tokenizer(args)
    if refused:
        raise FlagError(refused)


def server_config(args: argparse.Namespace) -> ServerConfig:
    """The ServerConfig a parsed `serve` command line means (FlagError: a combination that cannot be honoured)."""
    _check(args)
    name, extra_names = _served_names(args)
    return ServerConfig(
        model_dir=args.model, served_model_name=name, extra_served_names=extra_names, host=args.host, port=args.port,
        api_key=_api_key(args), max_body_bytes=args.max_body_bytes, reasoning_parser=args.reasoning_parser,
        tool_parser=args.tool_parser, tool_strict_level=args.tool_strict_level, engine_options=engine_options(args),
        replicas=args.replicas,
        engine_core=args.engine_core, ray_address=args.ray_address, chat_template=args.chat_template,
        generation_config=args.generation_config, limit_mm_per_prompt=args.limit_mm_per_prompt,
        weight_transfer_backend=args.weight_transfer_config, enable_sleep_mode=args.enable_sleep_mode,
        fetch=FetchConfig(allowed_media_paths=tuple(Path(p) for p in args.allowed_media_path),
                          allow_private_urls=args.allow_private_media_urls, timeout_s=args.media_fetch_timeout,
                          max_bytes=args.max_media_bytes),
        caps=MediaCaps(image_max_pixels=args.max_pixels, video_max_pixels=args.video_max_pixels,
                       max_video_frames=args.max_video_frames, max_video_fps=args.max_video_fps,
                       video_defaults=args.media_io_kwargs),
        max_sequences_per_request=args.max_sequences_per_request, max_logprob_entries=args.max_logprob_entries,
        metrics_public=args.metrics_public,
        body_timeout_s=args.body_timeout, header_timeout_s=args.header_timeout,
        shutdown_timeout_s=args.shutdown_timeout,
        templates=TemplateLimits(workers=args.template_workers, timeout_s=args.template_timeout),
        allowed_weights_paths=tuple(Path(p) for p in args.allowed_weights_path) or None)


def run_serve(args: argparse.Namespace) -> int:
    from servers.openai.launch import serve  # the server stack loads only to serve (parsing and --help stay light)

    try:
        config = server_config(args)
    except FlagError as e:
        print(f"mm-infer serve: error: {e}", file=sys.stderr)
        return 2
    for warning in ignored_flag_warnings(args):
        log.warning(warning)
    serve(config, args.log_level)
    return 0


def add_serve(sub: argparse._SubParsersAction) -> None:
    srv = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API",
                         usage="mm-infer serve MODEL [flags] (all flags: mm-infer serve --help)",
                         epilog="vLLM's `vllm serve` flags and --config FILE.yaml are read too: docs/vllm-cli.md")
    add_serve_flags(srv)
    add_vllm_flags(srv)
    srv.set_defaults(func=run_serve)


def serve_actions() -> dict[str, argparse.Action]:
    """The serve flags by option string (what --config's keys are matched against)."""
    srv = argparse.ArgumentParser(add_help=False)
    add_serve_flags(srv)
    add_vllm_flags(srv)
    return dict(srv._option_string_actions)


def build_parser() -> argparse.ArgumentParser:
    return library_cli.build_parser(add_serve)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse a command line the way `main` does (vLLM's --config, --model and snake_case names included)."""
    return build_parser().parse_args(vllm_argv(list(argv), serve_actions()))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        line = vllm_argv(list(sys.argv[1:] if argv is None else argv), serve_actions())
    except FlagError as e:
        print(f"mm-infer serve: error: {e}", file=sys.stderr)
        return 2
    return library_cli.main(line, add_serve)


if __name__ == "__main__":
    sys.exit(main())
