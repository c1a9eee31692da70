"""Corrupted real media (flipped bytes, truncation, splices) only ever raise MediaError, never crash."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from media_paths import IMAGES, VIDEOS

from mm_infer.media import MediaError, preprocess_images, preprocess_videos

IMAGE_BYTES = {p.name: p.read_bytes() for p in sorted(IMAGES.iterdir()) if p.stat().st_size < 100_000}
VIDEO_BYTES = {p.name: p.read_bytes() for p in sorted(VIDEOS.iterdir())}


def corrupt(data: bytes, flips: list[tuple[int, int]], cut: float) -> bytes:
    buf = bytearray(data[: max(1, int(len(data) * cut))])
    for pos, value in flips:
        buf[pos % len(buf)] = value
    return bytes(buf)


EXAMPLES = int(os.environ.get("MM_FUZZ_EXAMPLES", "40"))  # raise it for a longer fuzz run
mutations = st.tuples(st.lists(st.tuples(st.integers(0, 10**7), st.integers(0, 255)), max_size=8),
                      st.floats(0.05, 1.0))


@settings(max_examples=EXAMPLES * 2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(IMAGE_BYTES)), mutation=mutations)
def test_corrupted_images_raise_media_error_or_decode(name: str, mutation) -> None:
    data = corrupt(IMAGE_BYTES[name], *mutation)
    try:
        packed = preprocess_images([data], max_pixels=200704)
    except MediaError as e:
        assert e.status in (400, 413, 415) and str(e)
    else:
        assert packed.pixel_values.shape[0] == int(packed.imgs_sizes.prod())


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(VIDEO_BYTES)), mutation=mutations)
def test_corrupted_videos_raise_media_error_or_decode(name: str, mutation) -> None:
    # The default decoder only: decord segfaults on some of these (why `auto` means PyAV).
    data = corrupt(VIDEO_BYTES[name], *mutation)
    try:
        packed, (meta,) = preprocess_videos([data], max_pixels=50176)
    except MediaError as e:
        assert e.status in (400, 413, 415) and str(e)
    else:
        assert len(meta.frame_indices) == int(packed.num_frames[0])


@pytest.mark.parametrize("name", sorted(VIDEO_BYTES))
def test_video_cut_at_every_tenth_raises_media_error_or_decodes(name: str) -> None:
    data = VIDEO_BYTES[name]
    for tenth in range(1, 10):
        try:
            preprocess_videos([data[: len(data) * tenth // 10]], max_pixels=50176, decoder="pyav")
        except MediaError as e:
            assert e.status in (400, 413, 415)
