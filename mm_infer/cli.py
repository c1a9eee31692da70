"""The library half of the `mm-infer` command: generate from a local checkpoint, preprocess media.

`mm-infer serve` is added by servers/cli.py, the console entry point (the server sits above the library).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any


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


def _env(args: argparse.Namespace) -> int:
    from mm_infer.environment import runtime_report

    print(json.dumps(runtime_report(), indent=None if args.json else 1))
    return 0


class _Version(argparse.Action):
    """--version: mm-infer's version and what it runs on (torch, triton, transformers, the CPU's half GEMM path)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from mm_infer.environment import one_line

        print(one_line())
        parser.exit()


AddCommands = Callable[[Any], None]  # adds sub-commands to an argparse subparsers object


def build_parser(*extra: AddCommands) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mm-infer", description="mm-infer: multimodal generation for RL rollouts")
    parser.add_argument("--version", action=_Version, nargs=0, help="print versions, the CPU and its GEMM path")
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
    env = sub.add_parser("env", help="print versions, the CPU, torch's kernel level and the half GEMM path chosen")
    env.add_argument("--json", action="store_true", help="one line of JSON")
    env.set_defaults(func=_env)
    for add in extra:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None, *extra: AddCommands) -> int:
    args = build_parser(*extra).parse_args(argv)
    from mm_infer.media import MediaError

    try:
        return args.func(args)
    except MediaError as e:
        print(f"error ({e.status}): {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
