"""Frame samplers, frame-list inputs, per-frame pixel budgets and the metadata a video returns."""

from __future__ import annotations

import pytest
import torch
from media_paths import VIDEOS
from PIL import Image
from synth import video_bytes

from mm_infer.media import preprocess_videos
from mm_infer.media.errors import MediaInvalidError
from mm_infer.media.frame_sampling import qwen_num_frames, sample_indices


def test_qwen_rule_matches_qwen_vl_utils() -> None:
    # 10 s at 30 fps sampled at 2 fps: 20 frames spread by linspace(0, 299, 20).round().
    assert sample_indices("qwen", 300, 30.0) == torch.linspace(0, 299, 20).round().long().tolist()
    assert qwen_num_frames(7, 2.0) == 6  # clamped to floor(7 / 2) * 2
    assert qwen_num_frames(48, 24.0) == 4  # at least 4 frames
    assert qwen_num_frames(100_000, 30.0) == 768  # at most 768
    assert qwen_num_frames(300, 30.0, num_frames=9) == 8  # an explicit count rounds to the temporal patch


def test_hf_rule() -> None:
    assert sample_indices("hf", 300, 30.0) == torch.arange(0, 300, 300 / 20).int().tolist()
    assert sample_indices("hf", 300, 30.0, num_frames=9) == torch.arange(0, 300, 300 / 8).int().tolist()
    assert sample_indices("hf", 7, 2.0) == [0, 1, 2, 3, 4, 5]  # floor(7 / 2) * 2 frames from the start
    assert sample_indices("hf", 48, 24.0) == [0, 12, 24, 36]  # at least min_frames
    assert sample_indices("hf", 48, 24.0, min_frames=6) == [0, 8, 16, 24, 32, 40]
    assert len(sample_indices("hf", 100_000, 30.0, max_frames=100)) == 100
    with pytest.raises(MediaInvalidError, match="cannot sample 0 frames"):
        sample_indices("hf", 30, 10.0, num_frames=1)  # rounds to 0 (HF divides by zero there)
    with pytest.raises(MediaInvalidError, match="cannot sample 40 frames from a video of 30"):
        sample_indices("hf", 30, 10.0, num_frames=40)


def test_hf_float32_step_overshoot_is_clamped_like_vllm() -> None:
    # 59 frames at 2 fps: HF wants 58, but its float32 arange yields 59 indices ending at 59 (HF: IndexError).
    raw = torch.arange(0, 59, 59 / 58).int().tolist()
    assert len(raw) == 59 and raw[-1] == 59
    assert sample_indices("hf", 59, 2.0) == raw[:-1] + [58]
    assert sample_indices("vllm", 59, 2.0) == raw[:-1] + [58]


def test_vllm_rule_is_fps_driven() -> None:
    # vLLM 0.32's Qwen2-VL loader: the HF rule at min(fps, 30); num_frames is ignored (measured against the peer).
    assert sample_indices("vllm", 300, 30.0) == sample_indices("hf", 300, 30.0)
    assert sample_indices("vllm", 300, 30.0, num_frames=4) == sample_indices("hf", 300, 30.0)
    assert sample_indices("vllm", 3000, 60.0, fps=45) == sample_indices("hf", 3000, 60.0, fps=30)
    assert sample_indices("vllm", 300, 30.0, family="qwen3") == sample_indices("qwen3", 300, 30.0)
    assert sample_indices("vllm", 300, 30.0, num_frames=4, family="qwen3") == sample_indices("qwen3", 300, 30.0)


def test_unknown_sampler_and_unknown_frame_rate_are_refused() -> None:
    with pytest.raises(MediaInvalidError, match="unknown frame sampler 'uniform'"):
        sample_indices("uniform", 30, 10.0)
    for sampler in ("hf", "vllm", "qwen", "qwen3"):  # a 400, never a ZeroDivisionError
        with pytest.raises(MediaInvalidError, match="no frame rate"):
            sample_indices(sampler, 30, 0.0)
    assert sample_indices("hf", 30, 0.0, num_frames=4) == [0, 7, 15, 22]


def test_do_sample_frames_false_takes_every_frame() -> None:
    _, (meta,) = preprocess_videos([VIDEOS / "odd7_h264_2fps.mp4"], do_sample_frames=False)
    assert meta.frame_indices == list(range(7))


def test_sampled_video_metadata() -> None:
    packed, (meta,) = preprocess_videos([VIDEOS / "pan_h264_24fps.mp4"], min_pixels=3136, max_pixels=100352)
    assert meta.total_num_frames == 48 and meta.fps == 24.0
    assert meta.frame_indices == [0, 12, 24, 36]
    assert meta.sample_fps == pytest.approx(4 / 48 * 24)
    assert meta.second_per_grid_ts == pytest.approx(2 / meta.sample_fps)
    assert packed.num_frames.tolist() == [4] and packed.imgs_sizes[0, 0] == 2


def test_explicit_frame_indices_with_odd_count_pad_the_last_frame() -> None:
    packed, (meta,) = preprocess_videos([VIDEOS / "odd7_h264_2fps.mp4"], frame_indices=[0, 3, 6])
    assert meta.frame_indices == [0, 3, 6]
    assert packed.imgs_sizes[0, 0].item() == 2 and packed.num_frames.tolist() == [3]
    rows = packed.pixel_values.view(2, -1, 3, 2, 14 * 14)  # [gt, patches, C, temporal, p*p]
    assert torch.equal(rows[1, :, :, 0], rows[1, :, :, 1])  # frame 6 repeated as the padding frame


def test_frame_list_equals_decoded_video() -> None:
    from mm_infer.media.sources import read_encoded
    from mm_infer.media.video import decode_frames

    path = VIDEOS / "pan_vp9_10fps.webm"
    packed, (meta,) = preprocess_videos([path], decoder="pyav")
    frames = decode_frames(read_encoded(path), meta.frame_indices, "pyav")
    as_array, (m2,) = preprocess_videos([frames], fps=meta.sample_fps)
    as_pil, _ = preprocess_videos([[Image.fromarray(f) for f in frames]], fps=meta.sample_fps)
    assert torch.equal(as_array.pixel_values, packed.pixel_values)
    assert torch.equal(as_pil.pixel_values, packed.pixel_values)
    assert m2.second_per_grid_ts == pytest.approx(meta.second_per_grid_ts)
    assert m2.decoder == "frames"


def test_total_pixels_budget_shrinks_frames() -> None:
    data = video_bytes(40, fps=10, size=(320, 240))
    big, _ = preprocess_videos([data], min_pixels=3136, max_pixels=200704)
    small, _ = preprocess_videos([data], min_pixels=3136, max_pixels=200704, total_pixels=8 * 28 * 28 * 8)
    assert small.imgs_sizes[0, 1:].prod() < big.imgs_sizes[0, 1:].prod()
    # share = max(min(768*28*28, total / n * 2), 1.05 * min_pixels) with n = 8 frames sampled.
    assert small.imgs_sizes[0, 1:].prod() * 14 * 14 <= max(8 * 28 * 28 * 8 / 8 * 2, 3136 * 1.05)


def test_pil_backend_for_video_and_hash_depends_on_options() -> None:
    path = VIDEOS / "odd7_h264_2fps.mp4"
    a, _ = preprocess_videos([path], backend="pil")
    b, _ = preprocess_videos([path])
    c, _ = preprocess_videos([path])
    assert a.imgs_sizes.tolist() == b.imgs_sizes.tolist()
    assert a.content_hashes != b.content_hashes
    assert b.content_hashes == c.content_hashes
    assert float((a.pixel_values - b.pixel_values).abs().max()) < 0.2  # different resizers, same picture
