"""The `mm-infer` command: generate from a local checkpoint, preprocess media, or serve the OpenAI API."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence


def _generate(args: argparse.Namespace) -> int:
    from mm_infer import LLM, SamplingParams

    content: list[dict] = [{"type": "image"} for _ in args.image] + [{"type": "video"} for _ in args.video]
    content.append({"type": "text", "text": args.prompt})
    prompt = {"messages": [{"role": "user", "content": content}],
              "multi_modal_data": {"image": list(args.image), "video": list(args.video)}}
    t0 = time.perf_counter()
    llm = LLM(args.model, dtype=args.dtype)
    params = SamplingParams(n=args.n, temperature=args.temperature, seed=args.seed, max_tokens=args.max_tokens)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    elapsed = time.perf_counter() - t0
    for i, completion in enumerate(out.outputs):
        record = {"sample": i, "text": completion.text, "token_ids": list(completion.token_ids),
                  "logprobs": [round(x, 6) for x in completion.logprobs], "finish_reason": completion.finish_reason}
        print(json.dumps(record))
    print(f"prompt_tokens={len(out.prompt_token_ids)} samples={len(out.outputs)} "
          f"startup_s={llm.startup_seconds:.2f} total_s={elapsed:.2f}", file=sys.stderr)
    return 0


def _preprocess(args: argparse.Namespace) -> int:
    from mm_infer.media import preprocess_images, preprocess_videos

    if args.image:
        packed = preprocess_images(args.image, backend=args.backend, max_pixels=args.max_pixels)
        for path, grid, h in zip(args.image, packed.imgs_sizes.tolist(), packed.content_hashes, strict=True):
            print(json.dumps({"image": path, "grid_thw": grid, "tokens": grid[0] * grid[1] * grid[2] // 4,
                              "content_hash": h[:16]}))
    if args.video:
        packed, metas = preprocess_videos(args.video, max_pixels=args.max_pixels)
        for path, grid, meta in zip(args.video, packed.imgs_sizes.tolist(), metas, strict=True):
            print(json.dumps({"video": path, "grid_thw": grid, "frame_indices": meta.frame_indices,
                              "second_per_grid_ts": round(meta.second_per_grid_ts, 4), "decoder": meta.decoder}))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from servers.openai.config import FetchConfig, MediaCaps, ServerConfig  # the server sits above mm_infer
    from servers.openai.launch import serve

    engine = {k: v for k, v in (("dtype", args.dtype), ("max_model_len", args.max_model_len),
                                ("num_kv_blocks", args.num_kv_blocks), ("max_num_seqs", args.max_num_seqs),
                                ("seed", args.seed)) if v is not None}
    config = ServerConfig(
        model_dir=args.model, served_model_name=args.served_model_name, host=args.host, port=args.port,
        api_key=args.api_key, max_body_bytes=args.max_body_bytes, reasoning_parser=args.reasoning_parser,
        tool_parser=args.tool_parser, engine_options=engine, replicas=args.replicas, ray_address=args.ray_address,
        fetch=FetchConfig(allowed_media_paths=tuple(Path(p) for p in args.allowed_media_path),
                          allow_private_urls=args.allow_private_media_urls, timeout_s=args.media_fetch_timeout,
                          max_bytes=args.max_media_bytes),
        caps=MediaCaps(image_max_pixels=args.max_pixels, video_max_pixels=args.video_max_pixels,
                       max_video_frames=args.max_video_frames))
    serve(config, args.log_level)
    return 0


def _add_serve(sub: argparse._SubParsersAction) -> None:
    srv = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    srv.add_argument("model", help="checkpoint folder in Hugging Face format")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--api-key", default=os.environ.get("MM_INFER_API_KEY"),
                     help="require Authorization: Bearer <key> (default: $MM_INFER_API_KEY)")
    srv.add_argument("--served-model-name", default=None)
    srv.add_argument("--allowed-media-path", action="append", default=[], help="folder file:// URLs may read")
    srv.add_argument("--allow-private-media-urls", action="store_true", help="allow http(s) to private addresses")
    srv.add_argument("--media-fetch-timeout", type=float, default=10.0)
    srv.add_argument("--max-media-bytes", type=int, default=64 * 1024 * 1024)
    srv.add_argument("--max-body-bytes", type=int, default=100 * 1024 * 1024)
    srv.add_argument("--max-model-len", type=int, default=None)
    srv.add_argument("--num-kv-blocks", type=int, default=None)
    srv.add_argument("--max-num-seqs", type=int, default=None)
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
    srv.set_defaults(func=_serve)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mm-infer", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="chat with a local checkpoint about images and videos")
    gen.add_argument("model", help="checkpoint folder in Hugging Face format")
    gen.add_argument("--image", action="append", default=[], help="image path (repeatable)")
    gen.add_argument("--video", action="append", default=[], help="video path (repeatable)")
    gen.add_argument("--prompt", default="Describe this.")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--n", type=int, default=1)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--dtype", default="auto")
    gen.set_defaults(func=_generate)
    pre = sub.add_parser("preprocess", help="run the media pipeline and print grids and hashes")
    pre.add_argument("--image", action="append", default=[])
    pre.add_argument("--video", action="append", default=[])
    pre.add_argument("--backend", default="torchvision", choices=["torchvision", "pil"])
    pre.add_argument("--max-pixels", type=int, default=None)
    pre.set_defaults(func=_preprocess)
    _add_serve(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from mm_infer.media import MediaError

    try:
        return args.func(args)
    except MediaError as e:
        print(f"error ({e.status}): {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
