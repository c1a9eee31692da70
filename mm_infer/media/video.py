"""Video probing and frame decoding with PyAV or decord, decoding only the frames asked for."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np

from mm_infer.media.errors import MediaDecodeError, MediaError, MediaTooLargeError, MediaUnsupportedError
from mm_infer.media.limits import DEFAULT_LIMITS, MediaLimits
from mm_infer.media.sources import EncodedMedia

Decoder = Literal["auto", "decord", "pyav"]
DECODERS: tuple[str, ...] = ("auto", "decord", "pyav")

# `auto` means PyAV. decord is faster at picking sparse frames, but its bundled FFmpeg crashes the whole
# process (SIGSEGV in VideoReader) on some corrupted files that PyAV rejects cleanly, found by
# tests/media/test_fuzz_bad_bytes.py; a server must survive hostile bytes, so decord is opt-in, for
# trusted data. It is also not bit-exact with PyAV for MPEG-4 Part 2, whose IDCT is implementation-defined.
_NOT_BIT_EXACT_IN_DECORD = frozenset({"mpeg4", "msmpeg4v3", "msmpeg4v2", "h263"})


@dataclass(frozen=True)
class VideoInfo:
    """What the container says, read without decoding pixels."""

    total_frames: int
    fps: float
    width: int
    height: int
    codec: str

    @property
    def duration(self) -> float:
        return self.total_frames / self.fps if self.fps > 0 else 0.0


def _open_av(encoded: EncodedMedia):
    import av

    try:
        return av.open(io.BytesIO(encoded.data), mode="r")
    except (av.error.FFmpegError, ValueError, OSError) as e:  # ValueError: also bad UTF-8 in metadata
        raise MediaDecodeError(f"{encoded.origin} is not a decodable video: {e}") from None


def probe(encoded: EncodedMedia, *, limits: MediaLimits = DEFAULT_LIMITS) -> VideoInfo:
    """Frame count, fps, size and codec of the first video stream; checks frame and duration limits."""
    import av

    with _open_av(encoded) as container:
        if not container.streams.video:
            raise MediaUnsupportedError(f"{encoded.origin} has no video stream")
        stream = container.streams.video[0]
        if stream.codec_context is None:
            raise MediaUnsupportedError(f"{encoded.origin} has a video stream in a codec we cannot decode")
        codec = stream.codec_context.name
        if av.codec.Codec(codec, "r") is None:  # pragma: no cover - Codec raises when unknown
            raise MediaUnsupportedError(f"{encoded.origin} uses codec '{codec}', which cannot be decoded")
        rate = stream.average_rate or stream.guessed_rate or Fraction(0)
        fps = float(rate)
        total = int(stream.frames or 0)
        if total <= 0:  # some containers (WebM) do not store a count: count packets, no decoding
            try:
                total = sum(1 for p in container.demux(stream) if p.size > 0)
            except (av.error.FFmpegError, ValueError, OSError) as e:
                raise MediaDecodeError(f"{encoded.origin} is truncated or corrupt: {e}") from None
        info = VideoInfo(total, fps, stream.width, stream.height, codec)
    if info.total_frames <= 0:
        raise MediaDecodeError(f"{encoded.origin} has 0 frames")
    if info.fps <= 0:
        raise MediaDecodeError(f"{encoded.origin} has no frame rate")
    if info.width * info.height > limits.max_image_pixels:
        raise MediaTooLargeError(f"{encoded.origin} frames are {info.width}x{info.height}, over the limit of "
                                 f"{limits.max_image_pixels} pixels")
    if info.total_frames > limits.max_video_frames:
        raise MediaTooLargeError(f"{encoded.origin} has {info.total_frames} frames, over the limit of "
                                 f"{limits.max_video_frames}")
    if info.duration > limits.max_video_seconds:
        raise MediaTooLargeError(f"{encoded.origin} lasts {info.duration:.1f} s, over the limit of "
                                 f"{limits.max_video_seconds:.0f} s")
    return info


def check_decode_budget(origin: str, info: VideoInfo, indices: list[int], limits: MediaLimits) -> None:
    """Refuse, from the header alone, a video whose sampled frames would need too many decoded pixels.

    Decoding is sequential up to the last sampled frame, so the work is (last index + 1) frames of
    width x height, whatever the number of frames kept.
    """
    frames = max(indices) + 1
    pixels = frames * info.width * info.height
    if pixels > limits.max_video_decode_pixels:
        raise MediaTooLargeError(f"{origin}: sampling up to frame {frames - 1} decodes {frames} frames of "
                                 f"{info.width}x{info.height} = {pixels} pixels, over the decode budget of "
                                 f"{limits.max_video_decode_pixels} pixels (max_video_decode_pixels)")


def _count_decoded(origin: str, index: int, width: int, height: int, decoded: int, limits: MediaLimits) -> int:
    """Decoded pixels after one more frame; raises if the frame or the running total is over its limit."""
    if width * height > limits.max_image_pixels:
        raise MediaTooLargeError(f"{origin}: frame {index} is {width}x{height}, over the limit of "
                                 f"{limits.max_image_pixels} pixels")
    decoded += width * height
    if decoded > limits.max_video_decode_pixels:
        raise MediaTooLargeError(f"{origin}: decoding frame {index} ({width}x{height}) takes the decoded pixels to "
                                 f"{decoded}, over the decode budget of {limits.max_video_decode_pixels} pixels "
                                 f"(max_video_decode_pixels)")
    return decoded


def _iter_pyav(encoded: EncodedMedia, wanted: list[int], limits: MediaLimits) -> Iterator[tuple[int, np.ndarray]]:
    """Decode sequentially up to the last wanted frame; yield each wanted frame as RGB, one at a time.

    Every decoded frame is counted against the decode budget and the per-frame pixel cap, so a header
    that lies about the frame size cannot make us decode more than the budget.
    """
    import av

    if not wanted:
        return
    want, last, decoded, seen = set(wanted), wanted[-1], 0, set()
    with _open_av(encoded) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        try:
            for i, frame in enumerate(container.decode(stream)):
                decoded = _count_decoded(encoded.origin, i, frame.width, frame.height, decoded, limits)
                if i in want:
                    seen.add(i)
                    yield i, frame.to_ndarray(format="rgb24")  # [H, W, 3] uint8
                if i >= last:
                    break
        except MediaError:
            raise
        except (av.error.FFmpegError, ValueError, OSError) as e:
            raise MediaDecodeError(f"{encoded.origin} is truncated or corrupt: {e}") from None
    missing = [i for i in wanted if i not in seen]
    if missing:
        raise MediaDecodeError(f"{encoded.origin} ended before frames {missing[:5]} (truncated video?)")


def _iter_decord(encoded: EncodedMedia, wanted: list[int]) -> Iterator[tuple[int, np.ndarray]]:
    """Wanted frames one at a time from decord (each an accurate seek, as in one get_batch call)."""
    import decord

    try:
        reader = decord.VideoReader(io.BytesIO(encoded.data), num_threads=0)
        if wanted and wanted[-1] >= len(reader):
            raise MediaDecodeError(f"{encoded.origin} has {len(reader)} frames; index {wanted[-1]} is past the end")
        for i in wanted:
            yield i, reader.get_batch([i]).asnumpy()[0]  # [H, W, 3] uint8
    except decord.DECORDError as e:
        raise MediaDecodeError(f"{encoded.origin} is truncated or corrupt: {e}") from None
    except RuntimeError as e:
        raise MediaDecodeError(f"{encoded.origin} could not be decoded by decord: {str(e)[:200]}") from None


def decord_available() -> bool:
    try:
        import decord  # noqa: F401
    except ImportError:
        return False
    return True


def choose_decoder(decoder: str, info: VideoInfo) -> str:
    if decoder not in DECODERS:
        raise MediaUnsupportedError(f"unknown video decoder '{decoder}', expected one of {DECODERS}")
    if decoder == "auto":
        return "pyav"
    if decoder == "decord":
        if not decord_available():
            raise MediaUnsupportedError("decoder 'decord' is not installed")
        if info.codec in _NOT_BIT_EXACT_IN_DECORD:
            return "pyav"  # decord would differ from the reference by one level on some pixels
    return decoder


def iter_frames(encoded: EncodedMedia, indices: list[int], decoder: str,
                limits: MediaLimits = DEFAULT_LIMITS) -> Iterator[tuple[int, np.ndarray]]:
    """Each distinct index of `indices` once, ascending, as (index, uint8 [H, W, 3] RGB); one frame held at a time.

    A stream decord refuses goes to PyAV, which supplies the frames decord had not yet given.
    """
    wanted = sorted(set(indices))
    given = 0
    if decoder == "decord":
        try:
            for item in _iter_decord(encoded, wanted):
                yield item
                given += 1
            return
        except MediaDecodeError:
            pass
    yield from _iter_pyav(encoded, wanted[given:], limits)


def decode_frames(encoded: EncodedMedia, indices: list[int], decoder: str,
                  limits: MediaLimits = DEFAULT_LIMITS) -> np.ndarray:
    """Frames at `indices` as uint8 [N, H, W, 3] RGB, in the order asked: the full stack, for tests and tools.

    The request path uses mm_infer.media.video_decode.decode_resized, which never holds this stack.
    """
    frames = dict(iter_frames(encoded, indices, decoder, limits))
    return np.stack([frames[i] for i in indices])  # [N, H, W, 3]
