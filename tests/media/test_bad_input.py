"""Every bad input gets a MediaError with the right HTTP status and a message naming the problem."""

from __future__ import annotations

import base64
import io

import pytest
from media_paths import IMAGES, VIDEOS
from PIL import Image
from synth import jpeg_bytes, png_with_claimed_size, video_bytes, wav_bytes

from mm_infer.media import (
    MediaDecodeError,
    MediaError,
    MediaInvalidError,
    MediaLimits,
    MediaTooLargeError,
    MediaUnsupportedError,
    preprocess_images,
    preprocess_videos,
)


def _raises(exc: type[MediaError], status: int, match: str, fn, *args, **kwargs) -> MediaError:
    with pytest.raises(exc, match=match) as info:
        fn(*args, **kwargs)
    assert info.value.status == status
    return info.value


def test_garbage_bytes_are_400() -> None:
    _raises(MediaDecodeError, 400, "not a decodable image", preprocess_images, [b"\x00\x01garbage" * 20])


def test_empty_bytes_are_400() -> None:
    _raises(MediaDecodeError, 400, "empty", preprocess_images, [b""])


def test_truncated_jpeg_is_400() -> None:
    data = jpeg_bytes(256, 256)
    _raises(MediaDecodeError, 400, "truncated or corrupt", preprocess_images, [data[: len(data) // 2]])


@pytest.mark.parametrize(("data", "kind"), [
    (b"\x00\x00\x00\x18ftypheic" + b"\x00" * 64, "HEIC"),
    (b"%PDF-1.7\n" + b"\x00" * 64, "PDF"),
    (b"<svg xmlns='http://www.w3.org/2000/svg'></svg>", "SVG"),
])
def test_known_unsupported_formats_are_415(data: bytes, kind: str) -> None:
    _raises(MediaUnsupportedError, 415, kind, preprocess_images, [data])


def test_video_given_as_image_is_415() -> None:
    _raises(MediaUnsupportedError, 415, "video", preprocess_images, [(VIDEOS / "pan_h264_24fps.mp4").read_bytes()])


def test_decodable_but_unsupported_image_format_is_415() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buf, "ICO")
    _raises(MediaUnsupportedError, 415, "ICO image", preprocess_images, [buf.getvalue()])


def test_decompression_bomb_is_refused_from_the_header() -> None:
    err = _raises(MediaTooLargeError, 413, "refused before decoding", preprocess_images,
                  [png_with_claimed_size(60000, 60000)])
    assert "3600000000 pixels" in str(err)


def test_too_many_bytes_is_413() -> None:
    limits = MediaLimits(max_bytes=1000)
    _raises(MediaTooLargeError, 413, "limit of 1000", preprocess_images, [jpeg_bytes(128, 128)], limits=limits)
    _raises(MediaTooLargeError, 413, "limit of 1000", preprocess_images, [IMAGES / "photo.png"], limits=limits)


def test_too_many_items_is_413() -> None:
    limits = MediaLimits(max_items=2)
    _raises(MediaTooLargeError, 413, "3 media items", preprocess_images, [jpeg_bytes()] * 3, limits=limits)


def test_extreme_aspect_ratio_is_400() -> None:
    buf = io.BytesIO()
    Image.new("RGB", (4020, 20)).save(buf, "PNG")
    _raises(MediaInvalidError, 400, "aspect ratio", preprocess_images, [buf.getvalue()])


def test_bad_data_urls() -> None:
    _raises(MediaDecodeError, 400, "invalid base64", preprocess_images, ["data:image/png;base64,@@@"])
    _raises(MediaUnsupportedError, 415, "not base64", preprocess_images, ["data:image/png,rawtext"])
    _raises(MediaDecodeError, 400, "malformed data URL", preprocess_images, ["data:image/png;base64"])


def test_missing_file_and_remote_url() -> None:
    _raises(MediaDecodeError, 400, "cannot read media file", preprocess_images, ["/no/such/file.png"])
    _raises(MediaUnsupportedError, 415, "must be fetched", preprocess_images, ["https://example.com/a.png"])


def test_unsupported_input_type_and_bad_arrays() -> None:
    import numpy as np
    _raises(MediaUnsupportedError, 415, "type int", preprocess_images, [42])
    _raises(MediaInvalidError, 400, "uint8", preprocess_images, [np.zeros((8, 8, 3), dtype=np.float32)])
    _raises(MediaInvalidError, 400, r"\[H, W, 3\]", preprocess_images, [np.zeros((8, 8, 4), dtype=np.uint8)])


def test_unknown_backend_is_400() -> None:
    _raises(MediaInvalidError, 400, "unknown image backend", preprocess_images, [jpeg_bytes()], backend="cv2")


def test_zero_frame_video_is_400() -> None:
    # AVI writes its stream header even with no frame; MP4 then drops the track (no video stream).
    _raises(MediaDecodeError, 400, "has 0 frames", preprocess_videos, [video_bytes(0, codec="mpeg4", fmt="avi")])
    _raises(MediaUnsupportedError, 415, "no video stream", preprocess_videos, [video_bytes(0)])


def test_empty_frame_list_is_400() -> None:
    _raises(MediaInvalidError, 400, "0 frames", preprocess_videos, [[]])


def test_truncated_video_is_400() -> None:
    data = (VIDEOS / "pan_h264_24fps.mp4").read_bytes()
    _raises(MediaDecodeError, 400, "truncated|not a decodable video|ended before", preprocess_videos,
            [data[: len(data) // 3]])


def test_garbage_video_is_400() -> None:
    _raises(MediaDecodeError, 400, "not a decodable video", preprocess_videos, [b"garbage" * 100])


def test_audio_only_file_is_415() -> None:
    _raises(MediaUnsupportedError, 415, "no video stream", preprocess_videos, [wav_bytes()])


def test_too_many_frames_and_seconds_are_413() -> None:
    data = video_bytes(30, fps=10)
    _raises(MediaTooLargeError, 413, "30 frames, over the limit of 10", preprocess_videos, [data],
            limits=MediaLimits(max_video_frames=10))
    _raises(MediaTooLargeError, 413, "lasts 3.0 s", preprocess_videos, [data],
            limits=MediaLimits(max_video_seconds=2))
    _raises(MediaTooLargeError, 413, "over the limit of 4", preprocess_videos, [data], num_frames=8,
            limits=MediaLimits(max_sampled_frames=4))
    _raises(MediaTooLargeError, 413, "30 sampled frames, over the limit of 4", preprocess_videos, [data],
            do_sample_frames=False, limits=MediaLimits(max_sampled_frames=4))


def test_frame_indices_out_of_range_is_400() -> None:
    _raises(MediaInvalidError, 400, "out of range", preprocess_videos, [VIDEOS / "odd7_h264_2fps.mp4"],
            frame_indices=[0, 7])


def test_unknown_sampler_and_decoder() -> None:
    path = VIDEOS / "odd7_h264_2fps.mp4"
    _raises(MediaInvalidError, 400, "unknown frame sampler", preprocess_videos, [path], sampler="random")
    _raises(MediaUnsupportedError, 415, "unknown video decoder", preprocess_videos, [path], decoder="opencv")


def test_data_url_video_roundtrip_and_error_names_origin() -> None:
    payload = base64.b64encode(b"garbage" * 50).decode()
    err = _raises(MediaDecodeError, 400, "data URL", preprocess_videos, [f"data:video/mp4;base64,{payload}"])
    assert "not a decodable video" in str(err)
