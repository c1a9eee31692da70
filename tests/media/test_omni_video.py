"""Nemotron Omni videos against HF 5.24's processor goldens (scripts/golden/make_nemotron_omni_goldens.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from mm_infer.config import MediaConfig
from mm_infer.media import MediaInvalidError, MediaProcessor, preprocess_videos
from mm_infer.media.frame_sampling import sample_indices
from mm_infer.media.omni_video import OmniVideoSpec, frame_seconds, omni_tile, tubelet_rows
from mm_infer.prompt.media import media_defaults, video_overrides
from tests.media.test_omni_image import ARRAYS, GOLDEN, MODEL, REPO, check_rows

SPEC = OmniVideoSpec.from_config(json.loads((MODEL / "video_preprocessor_config.json").read_text()))


def source(case: dict):
    return ARRAYS["frames/frames5"] if case["source"].startswith("synthetic:") else REPO / case["source"]


def request_opts(kwargs: dict) -> dict:
    """What the library / server turn a request's mm_processor_kwargs into (prompt/media.py)."""
    d = media_defaults(MODEL, MediaConfig())
    over = video_overrides(kwargs, d)
    return {k: over[k] for k in ("fps", "num_frames", "do_sample_frames") if k in over}


@pytest.mark.parametrize("name", sorted(GOLDEN["videos"]))
def test_video_matches_hf(name: str) -> None:
    # catches: wrong tubelet channel order, last frame not repeated (odd7_all, pan30_n3, frames5), an unclamped
    # vs clamped or uint8 resize, the fused normalisation (videos are not fused), HF's frame sampling (pan24_fps2:
    # fps -> [0, 12, 24, 36]; pan30_n3: num_frames -> [0, 33, 66]), sampling when the checkpoint says not to
    case = GOLDEN["videos"][name]
    packed, (meta,) = preprocess_videos([source(case)], sampler="hf_base", omni=SPEC, **request_opts(case["kwargs"]))
    assert packed.imgs_sizes.tolist() == [case["grid"]]
    assert packed.pixel_values.shape == tuple(case["shape"])
    assert int(packed.num_frames[0]) == len(meta.frame_indices)  # the frames before padding
    check_rows(packed.pixel_values, f"video/{name}", case["sha256"])


def test_server_processor_samples_only_when_asked() -> None:
    # catches: the server path (MediaProcessor with the checkpoint's options) sampling at a default fps although the
    # checkpoint says do_sample_frames=false, or ignoring a request's fps
    d = media_defaults(MODEL, MediaConfig())
    image_opts, video_opts = d.processor_options()
    data = (REPO / GOLDEN["videos"]["pan24_fps2"]["source"]).read_bytes()
    with MediaProcessor(image_options=image_opts, video_options=video_opts, max_workers=1) as proc:
        _, (every,) = proc.process_videos([data])
        packed, (sampled,) = proc.process_videos([data], **video_overrides({"fps": 2.0}, d))
    assert every.frame_indices == list(range(48))
    assert sampled.frame_indices == [0, 12, 24, 36] and packed.num_frames.tolist() == [4]
    check_rows(packed.pixel_values, "video/pan24_fps2", GOLDEN["videos"]["pan24_fps2"]["sha256"])
    assert d.timestamps([sampled]) == [[0.0, 0.492, 0.984, 1.476]]  # int(1000 / 24) = 41 ms per frame index


def test_tubelet_rows_layout_and_padding() -> None:
    # catches: channel-major (c*T + t) instead of frame-major (t*C + c) tubelets, the last frame not repeated
    t, c, p = 3, 3, 16
    frames = (10 * torch.arange(t).view(t, 1, 1, 1) + torch.arange(c).view(1, c, 1, 1)).float().expand(t, c, 32, 48)
    rows, grid = tubelet_rows(frames, SPEC)
    assert grid == (2, 2, 3) and rows.shape == (2 * 2 * 3, 2 * c * p * p)
    first = rows[0].reshape(2 * c, p, p)[:, 0, 0].tolist()
    assert first == [0, 1, 2, 10, 11, 12]  # (t*C + c): frame 0's channels, then frame 1's
    padded = rows[6].reshape(2 * c, p, p)[:, 0, 0].tolist()
    assert padded == [20, 21, 22, 20, 21, 22]  # the second tubelet: frame 2 and its repeat


def test_tile_rule() -> None:
    # catches: (w, h) swapped (HF returns (pw, ph)), or rounding up when up overshoots the target
    assert omni_tile(240, 320, SPEC) == (6, 8)  # 7 x 9 rounds up to 8 x 10 = 80 > 64: down to 6 x 8
    assert omni_tile(56, 56, SPEC) == (8, 8)
    square = OmniVideoSpec((0.5,) * 3, (0.5,) * 3, target_patches=70, maintain_aspect_ratio=False)
    assert omni_tile(100, 300, square) == (8, 8)


def test_hf_base_sampler() -> None:
    # catches: the Qwen rules (multiples of the temporal patch, min 4 frames) used for Omni, or round instead of //
    assert sample_indices("hf_base", 48, 24.0, fps=2.0) == [0, 12, 24, 36]
    assert sample_indices("hf_base", 100, 30.0, fps=None, num_frames=3) == [0, 33, 66]
    assert sample_indices("hf_base", 5, 30.0, fps=None) == [0, 1, 2, 3, 4]
    assert sample_indices("hf_base", 10, 30.0, fps=0.1) == [0]  # max(1, int(...))
    with pytest.raises(MediaInvalidError, match="cannot sample 11 frames"):
        sample_indices("hf_base", 10, 30.0, fps=None, num_frames=11)


def test_frame_seconds() -> None:
    # catches: index / fps instead of HF's whole milliseconds for decoded files, or times without an fps
    assert frame_seconds([0, 12], 24.0) == [0.0, 0.492]
    assert frame_seconds([0, 1, 2], 24.0, listed=True) == [0.0, 1 / 24, 2 / 24]
    assert frame_seconds([0, 1], None) is None and frame_seconds([0, 1], 0.0) is None


def test_video_config_needs_norm_stats() -> None:
    # catches: a checkpoint without norm_mean / norm_std silently normalised with some default (HF fails)
    with pytest.raises(ValueError, match="norm_mean"):
        OmniVideoSpec.from_config({"video_processor_type": "NemotronH_Omni_Reasoning_V3VideoProcessor"})


def test_empty_and_bad_frame_lists_are_refused() -> None:
    # catches: an IndexError (500) instead of a 400 for an empty clip or frames of different sizes
    with pytest.raises(MediaInvalidError, match="0 frames"):
        preprocess_videos([[]], sampler="hf_base", omni=SPEC)
    mixed = [np.zeros((32, 32, 3), np.uint8), np.zeros((16, 32, 3), np.uint8)]
    with pytest.raises(MediaInvalidError, match="different sizes"):
        preprocess_videos([mixed], sampler="hf_base", omni=SPEC)
