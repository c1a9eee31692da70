"""Qwen3-VL preprocessing and prompts against transformers' own Qwen3-VL processors, bit for bit and token for token."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from media_paths import IMAGES, REPO, VIDEOS
from PIL import Image
from qwen3_hf_oracle import hf_processor

from mm_infer.media import preprocess_images, preprocess_videos
from mm_infer.media.frame_sampling import frame_timestamps
from mm_infer.media.patchify import PatchSpec
from mm_infer.media.sources import read_encoded
from mm_infer.media.video import decode_frames, probe
from mm_infer.prompt.placeholders import PromptError
from mm_infer.prompt.preparer import PromptPreparer

CKPT = REPO / "assets" / "models" / "tiny-qwen3-vl"
IMAGE_CFG = json.loads((CKPT / "preprocessor_config.json").read_text())
VIDEO_CFG = json.loads((CKPT / "video_preprocessor_config.json").read_text())
SPEC = PatchSpec.from_config(IMAGE_CFG)
IMAGE_KW = {"min_pixels": IMAGE_CFG["size"]["shortest_edge"], "max_pixels": IMAGE_CFG["size"]["longest_edge"]}
VIDEO_KW = {"min_pixels": VIDEO_CFG["size"]["shortest_edge"], "max_pixels": VIDEO_CFG["size"]["longest_edge"]}
VIDEO_NAMES = sorted(p.name for p in VIDEOS.iterdir())


@pytest.fixture(scope="module")
def proc():
    with hf_processor(CKPT) as p:
        yield p


def _decoded(name: str) -> tuple[np.ndarray, dict]:
    """All frames (PyAV) and the metadata HF's processor samples from."""
    encoded = read_encoded(VIDEOS / name)
    info = probe(encoded)
    return decode_frames(encoded, list(range(info.total_frames)), "pyav"), {"fps": info.fps,
                                                                           "total_num_frames": info.total_frames}


def test_spec_is_qwen3s():
    assert (SPEC.patch_size, SPEC.factor, SPEC.image_mean, SPEC.image_std) == (16, 32, (0.5,) * 3, (0.5,) * 3)


@pytest.mark.parametrize("name", ["photo.png", "tiny_9x13.png", "large_2000x1500.jpg", "strip_wide.png", "la.png"])
def test_images_match_hf_pil_processor_bit_for_bit(proc, name):
    image = Image.open(IMAGES / name)
    ref = proc.image_processor(images=[image], return_tensors="pt")
    ours = preprocess_images([image], backend="pil", spec=SPEC, **IMAGE_KW)
    assert ours.imgs_sizes.tolist() == ref["image_grid_thw"].tolist()
    assert ours.pixel_values.shape == ref["pixel_values"].shape and ours.pixel_values.shape[1] == 3 * 2 * 16 * 16
    assert torch.equal(ours.pixel_values, ref["pixel_values"])


@pytest.mark.parametrize("name", VIDEO_NAMES)
def test_videos_match_hf_processor_bit_for_bit(proc, name):
    """Sampling (fps 2, at least 4 frames), the clip-level resize, mean/std 0.5 and patch 16, as transformers."""
    frames, meta = _decoded(name)
    ref = proc.video_processor(videos=[frames], video_metadata=[meta], return_metadata=True, return_tensors="pt")
    ours, (info,) = preprocess_videos([VIDEOS / name], sampler="qwen3", family="qwen3", spec=SPEC, **VIDEO_KW)
    assert info.frame_indices == ref["video_metadata"][0].frames_indices.tolist()
    assert ours.imgs_sizes.tolist() == ref["video_grid_thw"].tolist()
    assert torch.equal(ours.pixel_values, ref["pixel_values_videos"])
    want = proc._calculate_timestamps(list(info.frame_indices), meta["fps"], 2)
    assert info.timestamps(2) == want


def test_timestamps_pad_odd_frame_counts():
    assert frame_timestamps([0, 6, 12], 10.0) == [0.3, 1.2]  # the last index repeats to fill the patch


def _messages() -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "video"},
                                         {"type": "text", "text": "What moves?"}]}]


@pytest.mark.parametrize("name", ["pan_vp9_10fps.webm", "odd7_h264_2fps.mp4"])
def test_prompt_token_ids_equal_hf_processor_with_timestamps(proc, name):
    image = Image.open(IMAGES / "photo.png").convert("RGB")
    frames, meta = _decoded(name)
    text = proc.tokenizer.apply_chat_template(_messages(), tokenize=False, add_generation_prompt=True)
    ref = proc(text=[text], images=[image], videos=[frames], video_metadata=[meta], return_tensors="pt")
    want = ref["input_ids"][0].tolist()
    assert "seconds>" in proc.tokenizer.decode(want)
    preparer = PromptPreparer(CKPT)
    req = preparer.prepare({"messages": _messages(), "multi_modal_data": {"image": [image], "video": [VIDEOS / name]},
                            "mm_processor_kwargs": {"backend": "pil"}})
    assert req.prompt_token_ids == want
    video = req.items[1]
    assert len([r for r in req.placeholders if r.modality == "video"]) == video.grid_thw[0]  # one run per frame
    assert torch.equal(video.pixel_values, ref["pixel_values_videos"])
    hf_pos, hf_delta = _hf_rope(ref)
    assert torch.equal(req.mrope_positions, hf_pos) and req.mrope_delta == hf_delta
    for preexpanded in (True, False):  # HF's expanded ids are checked, never expanded twice
        again = preparer.prepare({"prompt_token_ids": want, "media_tokens_preexpanded": preexpanded,
                                  "multi_modal_data": {"image": [image], "video": [VIDEOS / name]},
                                  "mm_processor_kwargs": {"backend": "pil"}})
        assert again.prompt_token_ids == want and again.placeholders == req.placeholders
    wrong = list(want)
    wrong[want.index(preparer.placeholder_ids.video_pad_id) - 3] += 1  # a digit of the first timestamp
    with pytest.raises(PromptError, match="does not match its expansion"):
        preparer.prepare({"prompt_token_ids": wrong, "media_tokens_preexpanded": True,
                          "multi_modal_data": {"image": [image], "video": [VIDEOS / name]},
                          "mm_processor_kwargs": {"backend": "pil"}})


def _hf_rope(ref) -> tuple[torch.Tensor, int]:
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    class _Cfg:  # get_rope_index reads only the merge size
        vision_config = type("V", (), {"spatial_merge_size": 2})

    holder = type("M", (), {"config": _Cfg, "get_vision_position_ids": Qwen3VLModel.get_vision_position_ids})()
    pos, delta = Qwen3VLModel.get_rope_index(holder, ref["input_ids"], ref["mm_token_type_ids"],
                                             ref["image_grid_thw"], ref["video_grid_thw"].clone())
    return pos[:, 0], int(delta[0, 0])


def test_framed_video_expansion_ranges_and_counts():
    from mm_infer.prompt.placeholders import FramedVideo, PlaceholderIds, expand_placeholders

    ids, video = PlaceholderIds(6, 7, 3, 4), FramedVideo(((100,), (101, 102)))
    kw = {"image_tokens": [], "image_hashes": [], "video_tokens": [4], "video_frames": [video]}
    out, ranges, _ = expand_placeholders([1, 3, 7, 4, 2], ids, video_hashes=["h"], **kw)
    assert out == [1, 3, 100, 3, 7, 7, 4, 101, 102, 3, 7, 7, 4, 4, 2]
    assert [(r.offset, r.length, r.item_offset) for r in ranges] == [(4, 2, 0), (10, 2, 2)]
    assert expand_placeholders(out, ids, video_hashes=["h"], preexpanded=True, **kw)[0] == out  # never twice
    with pytest.raises(PromptError, match="at least 2 video placeholder"):
        expand_placeholders([3, 7, 4, 3, 7, 4], ids, video_hashes=["h"], **kw)
    with pytest.raises(PromptError, match="0 video placeholder"):
        expand_placeholders([1, 2], ids, video_hashes=["h"], **kw)
