"""Shared builders for engine tests: tiny checkpoints, synthetic media prompts, the HF oracle."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch
from torch import Tensor

from mm_infer.media.packed import PackedTensor

REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "assets" / "models" / "tiny-qwen2-vl"
CKPT25 = REPO / "assets" / "models" / "tiny-qwen2.5-vl"
IMAGE, VIDEO, START, END = 3006, 3007, 3003, 3004
TEXT_VOCAB = 3000


def media(grids: list[tuple[int, int, int]], seed: int) -> PackedTensor:
    """Random pixel rows for items with grids (t, h, w); no content hash (the engine digests pixels)."""
    gen = torch.Generator().manual_seed(seed)
    rows = sum(t * h * w for t, h, w in grids)
    return PackedTensor(torch.randn(rows, 1176, generator=gen), torch.tensor(grids, dtype=torch.long).reshape(-1, 3),
                        torch.tensor([2 * g[0] if g[0] > 1 else 1 for g in grids], dtype=torch.long))


def text_ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, TEXT_VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def case(parts: list, seed: int) -> dict:
    """parts: ints (random text tokens), ("image", t, h, w) or ("video", t, h, w) -> prompt dict + raw pieces."""
    ids: list[int] = []
    grids: dict[str, list[tuple[int, int, int]]] = {"image": [], "video": []}
    for i, part in enumerate(parts):
        if isinstance(part, int):
            ids += text_ids(part, seed * 100 + i)
        else:
            kind, *grid = part
            grids[kind].append(tuple(grid))
            ids += [START, IMAGE if kind == "image" else VIDEO, END]
    mm = {k: media(g, seed * 7 + (k == "video")) for k, g in grids.items() if g}
    return {"prompt_token_ids": ids, "multi_modal_data": mm}


def expand(prompt: dict, merge: int = 2) -> list[int]:
    """Independent expansion for the oracle: each single pad becomes t*h*w/merge² pads, in order."""
    counts = {k: iter(v.tokens_per_item(merge)) for k, v in prompt["multi_modal_data"].items()}
    out: list[int] = []
    for t in prompt["prompt_token_ids"]:
        kind = {IMAGE: "image", VIDEO: "video"}.get(t)
        out += [t] * next(counts[kind]) if kind else [t]
    return out


@cache
def hf_model(path: Path = CKPT) -> torch.nn.Module:
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()


def hf_kwargs(prompt: dict, ids: list[int]) -> dict:
    """HF inputs for one sequence, including mm_token_type_ids (without it M-RoPE silently goes text-only)."""
    input_ids = torch.tensor([ids])
    types = torch.zeros_like(input_ids)
    types[input_ids == IMAGE] = 1
    types[input_ids == VIDEO] = 2
    kw = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "mm_token_type_ids": types}
    mm = prompt["multi_modal_data"]
    if "image" in mm:
        kw |= {"pixel_values": mm["image"].pixel_values, "image_grid_thw": mm["image"].imgs_sizes}
    if "video" in mm:
        kw |= {"pixel_values_videos": mm["video"].pixel_values, "video_grid_thw": mm["video"].imgs_sizes}
    return kw


@torch.inference_mode()
def hf_greedy(prompt: dict, max_new_tokens: int, path: Path = CKPT) -> list[int]:
    ids = expand(prompt)
    out = hf_model(path).generate(**hf_kwargs(prompt, ids), max_new_tokens=max_new_tokens, do_sample=False,
                                  suppress_tokens=[IMAGE, VIDEO])  # the engine never samples media pads
    return out[0, len(ids):].tolist()


@torch.inference_mode()
def hf_teacher_forced(prompt: dict, generated: list[int], path: Path = CKPT) -> Tensor:
    """Logprob of each generated token under one HF forward over prompt + generated: [len(generated)]."""
    ids = expand(prompt)
    kw = hf_kwargs(prompt, ids + generated)
    logits = hf_model(path)(**kw).logits[0].float()  # [L, V]
    lps = torch.log_softmax(logits[len(ids) - 1:-1], dim=-1)
    return lps.gather(1, torch.tensor(generated)[:, None])[:, 0]


MIXED = [  # text-only, one image, several images, video, image+video; unequal lengths
    [12], [40], [3, ("image", 1, 4, 4), 9], [("image", 1, 8, 6), 20], [5, ("image", 1, 6, 10), 2],
    [4, ("image", 1, 4, 4), 3, ("image", 1, 6, 6), 8],
    [7, ("image", 1, 4, 8), ("image", 1, 8, 4), ("image", 1, 4, 4), 1],
    [2, ("video", 2, 4, 6), 11], [("video", 4, 6, 4), 3], [6, ("image", 1, 6, 8), 5, ("video", 2, 4, 4), 4],
    [30, ("video", 2, 8, 8), 2, ("image", 1, 4, 6), 6], [1, ("image", 1, 10, 14), 1], [25],
    [3, ("image", 1, 4, 4), 2, ("image", 1, 4, 4), 2, ("image", 1, 4, 4), 2], [9, ("video", 2, 6, 6), 9],
    [14, ("image", 1, 12, 8), 33], [2, ("image", 1, 4, 6), 2, ("video", 2, 4, 6), 2, ("image", 1, 6, 4), 2],
    [60], [8, ("image", 1, 8, 8), 8], [5, ("video", 6, 4, 4), 5], [11, ("image", 1, 6, 6), 17],
    [4, ("image", 1, 14, 10), 4], [3, ("video", 2, 10, 6), 3],
]


def drain(engine) -> dict:  # noqa: ANN001 - an LLMEngine
    """Step the engine until nothing is left; the final output of every request that finished."""
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    return finals
