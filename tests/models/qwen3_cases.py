"""Builders for the Qwen3-VL tests: tiny checkpoints, prompts laid out as the HF processor writes them, oracles."""

from __future__ import annotations

from functools import cache

import torch
from model_cases import PROMPTS, REPO, TEXT_VOCAB, Prompt, hf_inputs  # noqa: F401 (PROMPTS for the qwen3 tests)
from torch import Tensor

from mm_infer.models import load_model
from mm_infer.prompt.mrope import get_mrope_positions

QWEN3 = {
    "qwen3_vl": REPO / "assets" / "models" / "tiny-qwen3-vl",
    "qwen3_vl_moe": REPO / "assets" / "models" / "tiny-qwen3-vl-moe",
}
QWEN35 = {"qwen3_5": REPO / "assets" / "models" / "tiny-qwen3.5",
          "qwen3_5_moe": REPO / "assets" / "models" / "tiny-qwen3.5-moe"}  # Qwen3-VL's processors and positions
IMAGES, VIDEOS = REPO / "assets" / "media" / "images", REPO / "assets" / "media" / "videos"
# at most 16 merged tokens per image (32 x 32 pixels each) and a few per video: keeps the engine tests fast
SMALL_MEDIA = {"max_pixels": 32 * 32 * 16, "video_max_pixels": 32 * 32 * 8 * 4, "fps": 1.0}
TIMESTAMP_TOKENS = 4  # stand-in length of the "<1.5 seconds>" text the processor writes before each frame


@cache
def ours(kind: str):
    return load_model((QWEN3 | QWEN35)[kind], dtype=torch.float32)


@cache
def hf(kind: str) -> torch.nn.Module:
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained((QWEN3 | QWEN35)[kind], dtype=torch.float32).eval()


def build_prompt(cfg, parts: list, seed: int = 0) -> Prompt:
    """parts: ints (random text tokens), ("image", t, h, w) or ("video", t, h, w).

    A video is written per temporal patch, as Qwen3VLProcessor does: timestamp text, then
    <|vision_start|> pads <|vision_end|>; pixel rows are random.
    """
    gen = torch.Generator().manual_seed(seed)
    merge2 = cfg.vision.spatial_merge_size**2
    text = lambda n: torch.randint(0, TEXT_VOCAB, (n,), generator=gen).tolist()  # noqa: E731
    ids: list[int] = []
    grids: dict[str, list[list[int]]] = {"image": [], "video": []}
    for part in parts:
        if isinstance(part, int):
            ids += text(part)
            continue
        kind, t, h, w = part
        grids[kind].append([t, h, w])
        run = [cfg.vision_start_token_id, *[cfg.image_token_id if kind == "image" else cfg.video_token_id]
               * (h * w // merge2), cfg.vision_end_token_id]
        ids += run if kind == "image" else [tok for _ in range(t) for tok in text(TIMESTAMP_TOKENS) + run]

    def pixels(kind: str) -> Tensor | None:
        n = sum(t * h * w for t, h, w in grids[kind])
        return torch.randn(n, cfg.vision.patch_dim, generator=gen) if n else None

    return Prompt(torch.tensor(ids), grids["image"], grids["video"], pixels("image"), pixels("video"))


def positions(cfg, prompt: Prompt) -> tuple[Tensor, int]:
    return get_mrope_positions(
        prompt.input_ids, prompt.image_grid_thw, prompt.video_grid_thw,
        image_token_id=cfg.image_token_id, video_token_id=cfg.video_token_id,
        vision_start_token_id=cfg.vision_start_token_id, spatial_merge_size=cfg.vision.spatial_merge_size,
        frame_runs=True,
    )


def our_logits(model, cfg, prompt: Prompt, pos: Tensor | None = None) -> Tensor:
    pos = positions(cfg, prompt)[0] if pos is None else pos
    return model(prompt.input_ids, pos, prompt.pixel_values, prompt.image_grid_thw,
                 prompt.pixel_values_videos, prompt.video_grid_thw)


def hf_logits(kind: str, cfg, prompt: Prompt) -> Tensor:
    return hf(kind)(**hf_inputs(cfg, prompt)).logits[0]


@torch.no_grad()
def greedy_diff(kind: str, prompt: Prompt) -> float:
    """HF generate (its cache, rope delta) vs our forward over prompt + generated ids with decode_positions: the
    greedy ids must be equal; returns the max diff of the step logits."""
    from mm_infer.prompt.mrope import decode_positions

    model, cfg = ours(kind)
    out = hf(kind).generate(**hf_inputs(cfg, prompt), max_new_tokens=6, do_sample=False, output_logits=True,
                            return_dict_in_generate=True, pad_token_id=0)
    n = prompt.input_ids.numel()
    new = out.sequences[0, n:]
    pos, delta = positions(cfg, prompt)
    prompt.input_ids = torch.cat([prompt.input_ids, new])
    logits = our_logits(model, cfg, prompt, torch.cat([pos, decode_positions(n, new.numel(), delta)], dim=1))
    step_logits = logits[n - 1:n - 1 + new.numel()]
    assert torch.equal(step_logits.argmax(-1), new)
    return (step_logits - torch.stack([s[0] for s in out.logits])).abs().max().item()


def chat_prompt(image: list[str] = (), video: list[str] = (), text: str = "Describe it.") -> dict:
    """An engine prompt dict: one user turn with the named assets/media files (images first), then text."""
    parts = [{"type": "image"} for _ in image] + [{"type": "video"} for _ in video]
    prompt: dict = {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]}
    media = {k: [str(root / n) for n in names] for k, root, names in (("image", IMAGES, image),
                                                                       ("video", VIDEOS, video)) if names}
    return prompt | ({"multi_modal_data": media, "mm_processor_kwargs": SMALL_MEDIA} if media else {})


@torch.no_grad()
def hf_completion_logprobs(kind: str, llm, request, completion: list[int]) -> Tensor:
    """Logprobs [G] of `completion` after the engine's expanded prompt, from one teacher-forced HF forward."""
    from mm_infer.rl import completion_logprobs, hf_inputs

    ids = llm.engine.placeholder_ids
    kw = hf_inputs(request, completion, image_pad_id=ids.image_pad_id, video_pad_id=ids.video_pad_id)
    return completion_logprobs(hf(kind)(**kw).logits, completion)
