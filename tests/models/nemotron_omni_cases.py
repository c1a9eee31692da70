"""The tiny Nemotron Omni checkpoint, ours and HF's (float32), and prompts laid out as HF's processor expands them."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

OMNI = Path(__file__).resolve().parents[2] / "assets" / "models" / "tiny-nemotron-omni"
TOL = 1e-4


@cache
def ours():
    from mm_infer.models.loader import load_model

    return load_model(OMNI)[0]


@cache
def hf():
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(OMNI, dtype=torch.float32).eval()


def ids_of(*tokens: str) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(OMNI / "tokenizer.json"))
    return [tok.token_to_id(t) for t in tokens]


def text_ids(n: int, seed: int) -> list[int]:
    """n ordinary BPE tokens (none special)."""
    return torch.randint(10, 2900, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def media_run(tokens: int) -> list[int]:
    """<img> + <image> * tokens + </img>, as the processor writes one image (or one tubelet)."""
    img, image, end = ids_of("<img>", "<image>", "</img>")
    return [img, *[image] * tokens, end]


def image_prompt(grids: list[tuple[int, int]], seed: int = 0) -> tuple[list[int], torch.Tensor]:
    """(ids: text, then each image's run between text, then text; normalised patches [sum gh*gw, 768])."""
    ids = text_ids(5, seed)
    for k, (gh, gw) in enumerate(grids):
        ids += media_run(gh * gw // 4) + text_ids(3, seed + k + 1)
    patches = torch.randn(sum(h * w for h, w in grids), 768, generator=torch.Generator().manual_seed(seed + 50))
    return ids, patches


def video_prompt(tubelets: int, gh: int, gw: int, seed: int = 0) -> tuple[list[int], torch.Tensor]:
    """(ids with one run per tubelet, separated by text; the video [tubelets, 2*3, 16gh, 16gw])."""
    ids = text_ids(4, seed)
    for t in range(tubelets):
        ids += text_ids(2, seed + 10 + t) + media_run(gh * gw // 4)
    ids += text_ids(3, seed + 99)
    video = torch.randn(tubelets, 6, 16 * gh, 16 * gw, generator=torch.Generator().manual_seed(seed + 60))
    return ids, video
