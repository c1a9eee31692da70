"""The default frame sampler against HF's own Qwen2-VL video processor sampling the frames itself (do_sample_frames)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from media_paths import REPO, VIDEOS

from mm_infer.config import MediaConfig
from mm_infer.media import preprocess_videos
from mm_infer.prompt.media import media_defaults

GOLDEN = REPO / "assets" / "golden" / "qwen2vl-hf-sampling"
INDEX = json.loads((GOLDEN / "INDEX.json").read_text())
SAMPLED = sorted(n for n, v in INDEX["videos"].items() if "error" not in v)
CKPT = REPO / "assets" / "models" / "tiny-qwen2-vl"  # the processor config the goldens were made with


def _ours(name: str, decoder: str = "auto", **kw):
    d = media_defaults(CKPT, MediaConfig())
    return preprocess_videos([VIDEOS / name], fps=d.video_fps, min_pixels=d.video_min_pixels,
                             max_pixels=d.video_max_pixels, decoder=decoder, **kw)


def test_every_video_in_the_folder_has_a_golden() -> None:
    assert sorted(INDEX["videos"]) == sorted(p.name for p in VIDEOS.iterdir())


@pytest.mark.parametrize("decoder", ["pyav", "auto"])
@pytest.mark.parametrize("name", SAMPLED)
def test_default_sampler_equals_hf_processor_bit_for_bit(name: str, decoder: str) -> None:
    ref = INDEX["videos"][name]
    packed, (meta,) = _ours(name, decoder)
    assert meta.frame_indices == ref["frame_indices"]
    assert packed.imgs_sizes.tolist() == [ref["video_grid_thw"]]
    ours = packed.pixel_values.numpy()
    assert list(ours.shape) == ref["shape"]
    assert hashlib.sha256(np.ascontiguousarray(ours).tobytes()).hexdigest() == ref["sha256"]
    npz = np.load(GOLDEN / f"{name}.npz")
    assert npz["frame_indices"].tolist() == ref["frame_indices"]


@pytest.mark.parametrize("name", SAMPLED)
def test_second_per_grid_ts_equals_qwen25_processor(name: str) -> None:
    # Qwen2_5_VLProcessor: temporal_patch_size / sampled fps, in float32 as the processor returns it.
    _, (meta,) = _ours(name)
    (ref,) = INDEX["videos"][name]["second_per_grid_ts"]
    assert float(np.float32(meta.second_per_grid_ts)) == ref


def test_qwen_rule_still_picks_other_frames() -> None:
    # The shared goldens used qwen-vl-utils' rule; on this clip it differs from HF's (the bug the default fixes).
    _, (hf,) = _ours("pan_h264_24fps.mp4")
    _, (qwen,) = _ours("pan_h264_24fps.mp4", sampler="qwen")
    assert hf.frame_indices == [0, 12, 24, 36] and qwen.frame_indices == [0, 16, 31, 47]


def test_clip_where_hf_raises_is_clamped_as_vllm() -> None:
    ref = INDEX["videos"]["pan_h264_2fps_59.mp4"]
    assert ref["error"].startswith("IndexError: index 59 is out of bounds")
    _, (meta,) = _ours("pan_h264_2fps_59.mp4")
    assert meta.frame_indices == list(range(59))  # HF's 59th index, 59, clamped to 58: every frame
