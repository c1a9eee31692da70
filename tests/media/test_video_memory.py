"""Video frames are resized as they are decoded (bit-exact with the full-stack path) under a decode-pixel budget."""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from media_paths import GOLDEN_INDEX, VIDEOS
from synth import video_bytes

from mm_infer.media import DEFAULT_LIMITS, MediaDecodeError, MediaLimits, MediaTooLargeError, preprocess_videos
from mm_infer.media.frame_sampling import sample_indices
from mm_infer.media.item_processing import _to_pixels
from mm_infer.media.patchify import DEFAULT_SPEC, frames_to_rows
from mm_infer.media.resize import smart_resize
from mm_infer.media.sources import read_encoded
from mm_infer.media.video import VideoInfo, check_decode_budget, decode_frames, decord_available
from mm_infer.media.video_decode import decode_resized

INDICES = [9, 0, 4, 4, 17, 12]  # unsorted, with a repeat: positions must follow the order asked


def _full_stack(data: bytes, indices: list[int], decoder: str, size: tuple[int, int], backend: str) -> torch.Tensor:
    """The pipeline before F3: decode every sampled frame at full size, then resize the [T, H, W, 3] stack."""
    return _to_pixels(decode_frames(read_encoded(data), indices, decoder), size, backend, DEFAULT_SPEC)


@pytest.mark.parametrize("backend", ["torchvision", "pil"])
@pytest.mark.parametrize("decoder", ["pyav", pytest.param("decord", marks=pytest.mark.skipif(
    not decord_available(), reason="decord is not installed"))])
@pytest.mark.parametrize(("min_pixels", "max_pixels"), [(3136, 12544), (3136, 602112), (200704, 401408)])
def test_resize_while_decoding_equals_resizing_the_full_stack(backend: str, decoder: str, min_pixels: int,
                                                              max_pixels: int) -> None:
    # Down (334x250 -> 112x84), unchanged (336x252 is already a multiple of 28) and up (to >= 200704 pixels).
    for size in [(334, 250), (336, 252)]:
        data = video_bytes(20, fps=10, size=size)
        width, height = size
        target = smart_resize(height, width, 28, min_pixels, max_pixels)
        ours = decode_resized(read_encoded(data), INDICES, decoder,
                              lambda h, w: smart_resize(h, w, 28, min_pixels, max_pixels), backend)
        reference = _full_stack(data, INDICES, decoder, target, backend)
        assert ours.dtype == torch.uint8 and tuple(ours.shape) == (len(INDICES), 3, *target)
        assert torch.equal(ours, reference), (size, target)


@pytest.mark.parametrize("backend", ["torchvision", "pil"])
@pytest.mark.parametrize("name", sorted(GOLDEN_INDEX["videos"]))
def test_pixel_values_equal_the_full_stack_path_on_every_asset(name: str, backend: str) -> None:
    packed, (meta,) = preprocess_videos([VIDEOS / name], backend=backend, min_pixels=3136, max_pixels=100352)
    data = (VIDEOS / name).read_bytes()
    stack = decode_frames(read_encoded(data), meta.frame_indices, "pyav")  # [T, H, W, 3]
    target = smart_resize(stack.shape[1], stack.shape[2], 28, 3136, 100352)
    rows, grid = frames_to_rows(_full_stack(data, meta.frame_indices, "pyav", target, backend), backend)
    assert packed.imgs_sizes.tolist() == [list(grid)]
    assert torch.equal(packed.pixel_values, rows)


def test_decode_budget_is_checked_from_the_header_before_any_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    import mm_infer.media.item_processing as processor

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("decoded a video the header already put over the budget")

    monkeypatch.setattr(processor, "decode_resized", never)
    data = video_bytes(30, fps=10, size=(64, 48))  # qwen-vl-utils at 2 fps: 6 frames, the last is frame 29
    with pytest.raises(MediaTooLargeError) as e:
        preprocess_videos([data], sampler="qwen", limits=MediaLimits(max_video_decode_pixels=30 * 64 * 48 - 1))
    assert e.value.status == 413
    message = str(e.value)
    assert "decode budget of 92159 pixels" in message and "max_video_decode_pixels" in message
    assert "30 frames of 64x48 = 92160 pixels" in message


def test_decode_budget_counts_the_frames_decoded_up_to_the_last_sampled() -> None:
    data = video_bytes(30, fps=10, size=(64, 48))
    limits = MediaLimits(max_video_decode_pixels=10 * 64 * 48)
    packed, _ = preprocess_videos([data], frame_indices=[0, 9], limits=limits)  # frames 0..9 decoded: at the budget
    assert packed.num_frames.tolist() == [2]
    with pytest.raises(MediaTooLargeError, match="11 frames of 64x48"):
        preprocess_videos([data], frame_indices=[0, 10], limits=limits)


def test_default_budget_admits_minutes_of_1080p_and_refuses_an_hour_of_4k() -> None:
    minutes_1080p = VideoInfo(int(6.4 * 60 * 30), 30.0, 1920, 1080, "h264")  # 768 frames at 2 fps: the sampler's max
    indices = sample_indices("qwen", minutes_1080p.total_frames, minutes_1080p.fps)
    assert len(indices) == 768
    check_decode_budget("clip", minutes_1080p, indices, DEFAULT_LIMITS)
    hour_4k = VideoInfo(3600 * 30, 30.0, 3840, 2160, "h264")
    with pytest.raises(MediaTooLargeError, match="over the decode budget"):
        check_decode_budget("clip", hour_4k, sample_indices("qwen", hour_4k.total_frames, hour_4k.fps), DEFAULT_LIMITS)


def _resolution_change(first: tuple[int, int], second: tuple[int, int]) -> bytes:
    """MPEG-TS concatenates: 10 frames at `first`, then 10 at `second`; the header reports only `first`."""
    return video_bytes(10, size=first, fmt="mpegts") + video_bytes(10, size=second, fmt="mpegts")


def test_frames_larger_than_the_header_are_counted_while_decoding() -> None:
    data = _resolution_change((64, 48), (512, 512))
    limits = MediaLimits(max_video_decode_pixels=100_000)  # the header's 20 x 64x48 = 61440 fits; 512x512 does not
    with pytest.raises(MediaTooLargeError, match="decoding frame 10 .512x512. takes the decoded pixels to"):
        preprocess_videos([data], frame_indices=[0, 19], limits=limits)
    with pytest.raises(MediaTooLargeError, match="frame 10 is 512x512, over the limit of 100000"):
        preprocess_videos([data], frame_indices=[0, 19], limits=MediaLimits(max_image_pixels=100_000))


def test_sampled_frames_that_change_size_mid_stream_are_400() -> None:
    data = _resolution_change((64, 48), (96, 64))
    with pytest.raises(MediaDecodeError, match="frame 15 is 96x64, but earlier sampled frames are 64x48") as e:
        preprocess_videos([data], frame_indices=[0, 15])
    assert e.value.status == 400


def _smooth_video(n_frames: int, side: int) -> bytes:
    """A side x side H.264 clip that compresses to a few tens of KB: a gradient with a moving white block."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=24, options={"preset": "ultrafast", "crf": "30"})
        stream.width, stream.height, stream.pix_fmt = side, side, "yuv420p"
        ramp = (np.arange(side) * 255 // side).astype(np.uint8)
        base = np.stack(np.broadcast_arrays(ramp[None, :], ramp[:, None], ramp[None, ::-1]), axis=-1)  # [H, W, 3]
        for i in range(n_frames):
            img = base.copy()
            top = (i * 32) % (side - 256)
            img[top : top + 256, 256:512] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, "rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def _child(path: str, n_frames: int) -> None:
    """Peak RSS growth of preprocessing the clip at `path`, on two cores so FFmpeg's thread pool is fixed."""
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:2]))
    preprocess_videos([video_bytes(8, size=(64, 48))])  # load codecs and thread pools before measuring
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    packed, _ = preprocess_videos([Path(path)], num_frames=n_frames, min_pixels=3136, max_pixels=12544)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"growth": peak - before, "grid": packed.imgs_sizes.tolist(),
                      "rows": packed.pixel_values.nbytes}))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in KiB and sched_setaffinity: Linux")
def test_peak_memory_is_bounded_by_sampled_frames_at_target_size(tmp_path: Path) -> None:
    n_frames, side = 48, 2048
    data = _smooth_video(n_frames, side)
    assert len(data) < 1024 * 1024  # small when encoded, 604 MB as a decoded stack
    path = tmp_path / "hires.mp4"
    path.write_bytes(data)
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, __file__, str(path), str(n_frames)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["grid"] == [[n_frames // 2, 8, 8]]  # each frame 112x112
    full_stack = n_frames * side * side * 3
    # Measured: about 55 MB (the small output, one 2048x2048 frame in flight, FFmpeg's 3 frame threads);
    # before the fix it was 1190 MB, the stack held twice. The bound leaves 2.5x headroom.
    assert result["growth"] < full_stack // 4, f"peak RSS grew {result['growth'] / 2**20:.0f} MB"


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
