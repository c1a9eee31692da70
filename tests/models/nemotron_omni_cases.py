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


def image_item(patches: torch.Tensor, grid: tuple[int, int], key: str):
    from mm_infer.prompt.request import MediaItem

    return MediaItem("image", patches, (1, *grid), key)


def video_item(video: torch.Tensor, key: str):
    """A video's tubelets [n, 2*3, H, W] as rows [n*gh*gw, 1536] (channel t*C+c, then py, px)."""
    from mm_infer.prompt.request import MediaItem

    n, ch, h, w = video.shape
    gh, gw = h // 16, w // 16
    rows = video.reshape(n, ch, gh, 16, gw, 16).permute(0, 2, 4, 1, 3, 5).reshape(n * gh * gw, ch * 256)
    return MediaItem("video", rows, (n, gh, gw), key)


def request(ids: list[int], items: list = ()):  # noqa: ANN201
    """A prepared VLMRequest: each <image> run in ids filled by the items in order (a video: one run per tubelet)."""
    from mm_infer.prompt.placeholders import PlaceholderRange
    from mm_infer.prompt.request import VLMRequest

    image = ids_of("<image>")[0]
    runs, i = [], 0
    while i < len(ids):
        if ids[i] == image:
            j = i
            while j < len(ids) and ids[j] == image:
                j += 1
            runs.append((i, j - i))
            i = j
        else:
            i += 1
    ranges, k = [], 0
    for index, item in enumerate(items):
        first = 0
        while first < item.num_tokens(2):
            offset, length = runs[k]
            ranges.append(PlaceholderRange(offset, length, item.modality, item.content_hash, index, first))
            first, k = first + length, k + 1
    assert k == len(runs), "every <image> run needs an item"
    positions = torch.arange(len(ids)).expand(3, -1).clone()
    return VLMRequest(list(ids), ranges, list(items), positions, 0)


def media_cases() -> dict[str, tuple]:
    """name -> (prompt ids, HF's media kwargs, our items)."""
    ids1, p1 = image_prompt([(4, 6)])
    ids2, p2 = image_prompt([(4, 6), (8, 2)], seed=3)
    idsv, v = video_prompt(3, 2, 4)
    return {
        "text": (text_ids(40, 1), {}, []),
        "one image": (ids1, dict(pixel_values=p1, image_grid_hw=torch.tensor([[4, 6]])),
                      [image_item(p1, (4, 6), "img-a")]),
        "two images": (ids2, dict(pixel_values=p2, image_grid_hw=torch.tensor([[4, 6], [8, 2]])),
                       [image_item(p2[:24], (4, 6), "img-b"), image_item(p2[24:], (8, 2), "img-c")]),
        "video": (idsv, dict(pixel_values_videos=v[None]), [video_item(v, "vid-a")]),
    }
