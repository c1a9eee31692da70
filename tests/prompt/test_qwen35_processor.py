"""Qwen3.5 prompts: PromptPreparer's ids, grids, pixel values and M-RoPE positions against HF 5.24's AutoProcessor
(Qwen3VLProcessor + Qwen2VLImageProcessor + Qwen3VLVideoProcessor, torchvision) on one real image and video (goldens
made by scripts/golden/make_qwen35_goldens.py)."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import torch

from mm_infer.prompt.placeholders import PromptError
from mm_infer.prompt.preparer import PromptPreparer
from mm_infer.prompt.request import VLMRequest

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "assets" / "models" / "tiny-qwen3.5"
GOLDEN_DIR = REPO / "tests" / "golden" / "qwen35"
GOLDEN = json.loads((GOLDEN_DIR / "golden.json").read_text())
ARRAYS = dict(np.load(GOLDEN_DIR / "arrays.npz"))
MEDIA = {"image": [REPO / GOLDEN["image"]], "video": [REPO / GOLDEN["video"]]}


@lru_cache(maxsize=1)
def preparer() -> PromptPreparer:
    return PromptPreparer(MODEL)


@lru_cache(maxsize=1)
def prepared() -> VLMRequest:
    return preparer().prepare({"messages": GOLDEN["messages"], "multi_modal_data": MEDIA})


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().astype("<f4").tobytes()).hexdigest()


def test_the_golden_is_hfs_qwen3_vl_processors():
    assert GOLDEN["transformers"] == "5.24.0"
    assert GOLDEN["classes"] == {"processor": "Qwen3VLProcessor", "image_processor": "Qwen2VLImageProcessor",
                                 "video_processor": "Qwen3VLVideoProcessor"}


def test_expanded_ids_and_token_types_equal_hf():
    # catches: a video written without its per-frame "<t seconds>" text, pads counted before the 2x2 merge
    req = prepared()
    assert req.prompt_token_ids == GOLDEN["input_ids"]
    ids = preparer().placeholder_ids
    types = [1 if t == ids.image_pad_id else 2 if t == ids.video_pad_id else 0 for t in req.prompt_token_ids]
    assert types == GOLDEN["mm_token_type_ids"] and types.count(2) == 4 * 16 * 20 // 4


@pytest.mark.parametrize("modality, key", [("image", "pixel_values"), ("video", "pixel_values_videos")])
def test_pixel_values_and_grids_equal_hf_bit_for_bit(modality, key):
    (item,) = [it for it in prepared().items if it.modality == modality]
    assert [list(item.grid_thw)] == GOLDEN[f"{modality}_grid_thw"]
    assert list(item.pixel_values.shape) == GOLDEN[key]["shape"]
    assert torch.equal(item.pixel_values[:len(ARRAYS[f"{key}_head"])], torch.from_numpy(ARRAYS[f"{key}_head"]))
    assert digest(item.pixel_values) == GOLDEN[key]["sha256"]


def test_mrope_positions_equal_hfs_get_rope_index():
    req = prepared()
    assert torch.equal(req.mrope_positions, torch.from_numpy(ARRAYS["mrope_positions"]).to(req.mrope_positions.dtype))
    assert req.mrope_delta == GOLDEN["mrope_delta"]


@pytest.mark.parametrize("flag", [True, False])
def test_hfs_expanded_ids_are_checked_never_expanded_twice(flag):
    req = preparer().prepare({"prompt_token_ids": GOLDEN["input_ids"], "multi_modal_data": MEDIA,
                              "media_tokens_preexpanded": flag})
    assert req.prompt_token_ids == GOLDEN["input_ids"] and req.placeholders == prepared().placeholders


def test_an_expanded_run_one_pad_short_is_refused():
    ids = list(GOLDEN["input_ids"])
    del ids[ids.index(preparer().placeholder_ids.video_pad_id)]
    with pytest.raises(PromptError, match="video 0"):
        preparer().prepare({"prompt_token_ids": ids, "multi_modal_data": MEDIA, "media_tokens_preexpanded": True})
