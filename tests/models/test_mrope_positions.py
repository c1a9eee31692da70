"""get_mrope_positions / decode_positions equal transformers' get_rope_index, and decoding resumes where HF's
generate resumes (the last prompt position + 1 after trailing text; its rope_deltas after trailing media)."""

from __future__ import annotations

import random

import pytest
import torch
from model_cases import CHECKPOINTS, build_prompt, mm_token_type_ids, our_positions

from mm_infer.models import load_config
from mm_infer.prompt.mrope import decode_positions, get_mrope_positions

LAYOUTS = {
    "text_only": [9],
    "image_first": [("image", 1, 4, 6), 3],
    "image_last": [2, ("image", 1, 8, 4)],
    "two_images": [2, ("image", 1, 4, 6), 1, ("image", 1, 10, 2), 4],
    "video": [1, ("video", 4, 6, 4), 2],
    "long_video": [1, ("video", 12, 4, 4), 2],  # temporal span beyond max(h, w)/merge
    "image_video_image": [1, ("image", 1, 2, 2), 1, ("video", 2, 4, 8), 1, ("image", 1, 6, 6), 1],
}

_RNG_LAYOUTS = []
for seed in range(12):
    rng = random.Random(seed)
    parts: list = []
    for _ in range(rng.randint(1, 4)):
        parts.append(rng.randint(0, 4) or 1)
        kind = rng.choice(["image", "video"])
        t = 1 if kind == "image" else rng.randint(1, 9)
        parts.append((kind, t, 2 * rng.randint(1, 5), 2 * rng.randint(1, 5)))
    _RNG_LAYOUTS.append(parts + [rng.randint(1, 3)])


def hf_rope_index(kind: str, prompt, cfg):
    """Call HF's get_rope_index on a bare (weightless) HF model object built from the same config."""
    inner = _hf_inner(kind)
    kw = dict(
        input_ids=prompt.input_ids[None],
        mm_token_type_ids=mm_token_type_ids(cfg, prompt.input_ids)[None],
        image_grid_thw=prompt.image_grid_thw,
        video_grid_thw=prompt.video_grid_thw,
    )
    if kind == "qwen2_5_vl" and prompt.second_per_grid_ts is not None:
        kw["second_per_grid_ts"] = torch.tensor(prompt.second_per_grid_ts)
    pos, delta = inner.get_rope_index(**kw)
    return pos[:, 0], int(delta.reshape(-1)[0])


_INNER: dict = {}


def _hf_inner(kind: str):
    if kind not in _INNER:
        from transformers import AutoConfig, AutoModelForImageTextToText

        config = AutoConfig.from_pretrained(CHECKPOINTS[kind])
        with torch.device("meta"):
            _INNER[kind] = AutoModelForImageTextToText.from_config(config).model
    return _INNER[kind]


@pytest.mark.parametrize("kind", sorted(CHECKPOINTS))
@pytest.mark.parametrize("layout", list(LAYOUTS.values()) + _RNG_LAYOUTS,
                         ids=list(LAYOUTS) + [f"random{i}" for i in range(len(_RNG_LAYOUTS))])
@pytest.mark.parametrize("seconds", [None, 0.7], ids=["default_seconds", "seconds_0.7"])
def test_positions_and_delta_equal_hf(kind, layout, seconds):
    cfg = load_config(CHECKPOINTS[kind])
    n_videos = sum(1 for p in layout if isinstance(p, tuple) and p[0] == "video")
    prompt = build_prompt(cfg, layout, seconds=[seconds] * n_videos if seconds and n_videos else None)
    got, delta = our_positions(cfg, prompt)
    want, rope_deltas = hf_rope_index(kind, prompt, cfg)
    assert torch.equal(got, want)
    ends_in_text = isinstance(layout[-1], int)
    # HF's generate continues each row from its last id: one delta when the prompt ends in text
    assert delta == (int(want[0, -1]) + 1 - want.shape[1] if ends_in_text else rope_deltas)


def test_qwen25_video_time_scaling():
    """Temporal ids step by tokens_per_second * second_per_grid_t, truncated; h/w ids unchanged."""
    ids = [7, 9, 5] + [99] * 2 + [1]  # one video, grid (2, 2, 2) -> 2 tokens
    pos, delta = get_mrope_positions(ids, None, [[2, 2, 2]], image_token_id=98, video_token_id=99,
                                     spatial_merge_size=2, tokens_per_second=2, second_per_grid_ts=[1.75])
    assert pos[:, 3:5].tolist() == [[3, 6], [3, 3], [3, 3]]  # t: 3 + floor(k * 3.5)
    assert pos[:, 5].tolist() == [4, 4, 4]  # text resumes at start + max(h, w)/merge
    assert delta == 5 - 6  # decoding resumes after the last prompt position (4), as HF's generate


def test_decode_positions_continue_after_the_prompt():
    pos = decode_positions(10, 3, delta=-4)
    assert pos.shape == (3, 3) and pos.tolist() == [[6, 7, 8]] * 3


@pytest.mark.parametrize(
    ("ids", "images", "error"),
    [
        ([1, 50, 50, 50, 2], [[1, 4, 4]], "has 3 tokens"),
        ([1, 50, 50, 50, 50, 2], None, "more image token runs"),
        ([1, 2], [[1, 4, 4]], "more image grids"),
        ([50, 50, 50, 50, 2], [[1, 4, 4]], "vision start"),
    ],
)
def test_inconsistent_inputs_raise(ids, images, error):
    with pytest.raises(ValueError, match=error):
        get_mrope_positions(ids, images, None, image_token_id=50, video_token_id=51, vision_start_token_id=1,
                            spatial_merge_size=2)
