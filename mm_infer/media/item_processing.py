"""Per-item image and video processing, and the public preprocess_images / preprocess_videos."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from mm_infer.media.errors import MediaDecodeError, MediaInvalidError, MediaTooLargeError, MediaUnsupportedError
from mm_infer.media.frame_sampling import (
    QWEN_MAX_FRAMES,
    QWEN_MIN_FRAMES,
    check_indices,
    frame_timestamps,
    sample_indices,
)
from mm_infer.media.image import check_pil_image, open_image, to_rgb
from mm_infer.media.limits import DEFAULT_LIMITS, MediaLimits
from mm_infer.media.omni_image import OmniImageSpec, omni_image_rows
from mm_infer.media.omni_video import OmniVideoSpec, decode_omni, omni_video_rows
from mm_infer.media.packed import PackedTensor
from mm_infer.media.patchify import BACKENDS, DEFAULT_SPEC, PatchSpec
from mm_infer.media.resize import resize_frames_torch, resize_image_pil, smart_resize, smart_resize_clip
from mm_infer.media.sources import (
    EncodedMedia,
    MediaInput,
    array_digest,
    is_encoded,
    options_digest,
    pil_digest,
    read_encoded,
)
from mm_infer.media.video import VideoInfo, check_decode_budget, choose_decoder, probe
from mm_infer.media.video_decode import decode_resized

IMAGE_MIN_PIXELS = 56 * 56
IMAGE_MAX_PIXELS = 28 * 28 * 1280
VIDEO_MIN_PIXELS = 128 * 28 * 28
VIDEO_MAX_PIXELS = 768 * 28 * 28


@dataclass(frozen=True)
class ImageOptions:
    min_pixels: int = IMAGE_MIN_PIXELS
    max_pixels: int = IMAGE_MAX_PIXELS
    backend: str = "torchvision"
    exif_transpose: bool = True
    spec: PatchSpec = DEFAULT_SPEC
    omni: OmniImageSpec | None = None  # Nemotron Omni: its processor instead (the pixel bounds are not used)


@dataclass(frozen=True)
class VideoOptions:
    sampler: str = "hf"  # frame_sampling.SAMPLERS; "hf": the checkpoint's HF video processor with do_sample_frames
    fps: float | None = 2.0  # None: no target rate (the "hf_base" sampler keeps every frame)
    num_frames: int | None = None
    frame_indices: tuple[int, ...] | None = None
    min_pixels: int = VIDEO_MIN_PIXELS
    max_pixels: int = VIDEO_MAX_PIXELS
    total_pixels: int | None = None
    decoder: str = "auto"
    backend: str = "torchvision"
    spec: PatchSpec = DEFAULT_SPEC
    family: str = "qwen2"  # "qwen3": one frame size per clip, the pixel budget over all frames (Qwen3VLVideoProcessor)
    do_sample_frames: bool = True  # False: every frame of the clip, as HF's processor without sampling
    min_frames: int = QWEN_MIN_FRAMES  # the sampler's bounds (video_preprocessor_config.json)
    max_frames: int = QWEN_MAX_FRAMES
    omni: OmniVideoSpec | None = None  # Nemotron Omni: its tile, float resize and tubelets (pixel bounds unused)


@dataclass
class VideoMetadata:
    """How a video was sampled: what M-RoPE (second_per_grid_ts) and callers need to know."""

    total_num_frames: int
    fps: float  # source frame rate
    frame_indices: list[int] = field(default_factory=list)
    sample_fps: float = 0.0
    second_per_grid_ts: float = 0.0
    decoder: str = ""

    @property
    def duration(self) -> float:
        return self.total_num_frames / self.fps if self.fps > 0 else 0.0

    def timestamps(self, temporal_patch: int = 2) -> list[float]:
        """Seconds of each temporal patch (the "<t seconds>" of Qwen3-VL prompts)."""
        return frame_timestamps(self.frame_indices, self.fps, temporal_patch)


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise MediaInvalidError(f"unknown image backend '{backend}', expected one of {BACKENDS}")


def _to_pixels(frames: np.ndarray | Sequence[Image.Image], size: tuple[int, int], backend: str,
               spec: PatchSpec) -> torch.Tensor:
    """uint8 frames [T, H, W, 3] (or RGB PIL frames) -> uint8 [T, 3, h, w] resized by the backend."""
    if backend == "pil":
        pils = [f if isinstance(f, Image.Image) else Image.fromarray(f) for f in frames]
        resized = np.stack([resize_image_pil(p, size) for p in pils])  # [T, h, w, 3]
        return torch.from_numpy(resized).permute(0, 3, 1, 2)
    arr = np.stack([np.asarray(f) for f in frames]) if not isinstance(frames, np.ndarray) else frames
    x = torch.from_numpy(np.ascontiguousarray(arr)).permute(0, 3, 1, 2)  # [T, 3, H, W]
    return resize_frames_torch(x, size)


def _image_array(item: MediaInput) -> np.ndarray:
    arr = item.cpu().numpy() if isinstance(item, torch.Tensor) else np.asarray(item)
    if arr.dtype != np.uint8:
        raise MediaInvalidError(f"image arrays must be uint8, got {arr.dtype}")
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise MediaInvalidError(f"image arrays must be [H, W, 3] or [H, W], got shape {tuple(arr.shape)}")
    return arr


def load_image_rgb(item: MediaInput, opts: ImageOptions, limits: MediaLimits) -> tuple[Image.Image | np.ndarray, str]:
    """Any accepted image input -> (RGB PIL image or uint8 [H, W, 3], source digest)."""
    if is_encoded(item):
        encoded = read_encoded(item, limits=limits)
        return to_rgb(open_image(encoded, limits=limits, exif_transpose=opts.exif_transpose)), encoded.digest
    if isinstance(item, Image.Image):
        check_pil_image(item, limits=limits)
        try:
            rgb = to_rgb(item)
        except OSError as e:
            raise MediaDecodeError(f"PIL image could not be loaded: {e}") from None
        return rgb, pil_digest(rgb)
    if isinstance(item, (np.ndarray, torch.Tensor)):
        arr = _image_array(item)
        if arr.shape[0] * arr.shape[1] > limits.max_image_pixels:
            raise MediaTooLargeError(f"image array of {arr.shape[1]}x{arr.shape[0]} pixels is over the limit of "
                                     f"{limits.max_image_pixels}")
        return arr, array_digest(arr)
    raise MediaUnsupportedError(f"unsupported image input of type {type(item).__name__}")


def process_image(item: MediaInput, opts: ImageOptions, limits: MediaLimits = DEFAULT_LIMITS,
                  n_images: int = 1) -> PackedTensor:
    """One image -> a one-item PackedTensor of its resized uint8 frame (grid t = 1); Nemotron Omni's (`opts.omni`)
    in rows form, its patch budget that of a call of `n_images`."""
    _check_backend(opts.backend)
    image, digest = load_image_rgb(item, opts, limits)
    if opts.omni is not None:
        chw = torch.from_numpy(np.array(image)).permute(2, 0, 1)  # [3, H, W] uint8
        rows, grid = omni_image_rows(chw, opts.omni, n_images)
        key = options_digest(digest, ("image", opts, n_images))
        return PackedTensor(rows, torch.tensor([grid]), torch.ones(1, dtype=torch.long), [key])
    height, width = (image.height, image.width) if isinstance(image, Image.Image) else image.shape[:2]
    size = smart_resize(height, width, opts.spec.factor, opts.min_pixels, opts.max_pixels)
    frames = [image] if opts.backend == "pil" else np.array(image)[None]  # [1, H, W, 3], writable
    pixels = _to_pixels(frames, size, opts.backend, opts.spec)  # [1, 3, h, w] uint8
    key = options_digest(digest, ("image", opts))
    return PackedTensor.from_frames([pixels], [key], backend=opts.backend, spec=opts.spec)


def _frame_list(item: Sequence | np.ndarray) -> np.ndarray:
    """A video given as frames (PIL images or uint8 arrays) -> uint8 [T, H, W, 3]."""
    frames = [np.asarray(to_rgb(f)) if isinstance(f, Image.Image) else _image_array(f) for f in item]
    if not frames:
        raise MediaInvalidError("video has 0 frames")
    if len({f.shape for f in frames}) != 1:
        raise MediaInvalidError("video frames have different sizes")
    return np.stack(frames)


def _frame_size(opts: VideoOptions, n_frames: int, height: int, width: int) -> tuple[int, int]:
    """Target (h, w) of every frame of a clip of n_frames sampled frames."""
    if opts.family == "qwen3":
        return smart_resize_clip(n_frames, height, width, opts.spec.factor, opts.spec.temporal_patch_size,
                                 opts.min_pixels, opts.max_pixels)
    return smart_resize(height, width, opts.spec.factor, opts.min_pixels, _frame_budget(opts, n_frames))


def _frame_budget(opts: VideoOptions, n_frames: int) -> int:
    """Per-frame max_pixels; with total_pixels, an even share of the budget as qwen-vl-utils computes it."""
    if opts.total_pixels is None:
        return opts.max_pixels
    share = max(min(VIDEO_MAX_PIXELS, opts.total_pixels / n_frames * opts.spec.temporal_patch_size),
                int(opts.min_pixels * 1.05))
    return int(min(opts.max_pixels, share))


def _sampled_indices(info: VideoInfo, opts: VideoOptions, limits: MediaLimits, origin: str) -> list[int]:
    """The caller's frame_indices (checked), every frame (do_sample_frames=False) or the sampler's pick, within the
    sampled-frame cap."""
    if opts.frame_indices is not None:
        return check_indices(list(opts.frame_indices), info.total_frames, max_sampled=limits.max_sampled_frames)
    if not opts.do_sample_frames:
        indices = list(range(info.total_frames))
    else:
        indices = sample_indices(opts.sampler, info.total_frames, info.fps, fps=opts.fps, num_frames=opts.num_frames,
                                 factor=opts.spec.temporal_patch_size, min_frames=opts.min_frames,
                                 max_frames=min(opts.max_frames, limits.max_sampled_frames), family=opts.family)
    if len(indices) > limits.max_sampled_frames:
        raise MediaTooLargeError(f"{origin}: {len(indices)} sampled frames, over the limit of "
                                 f"{limits.max_sampled_frames}")
    return indices


def _open_video(item: MediaInput, opts: VideoOptions,
                limits: MediaLimits) -> tuple[EncodedMedia, VideoInfo, list[int], str]:
    """Encoded video -> (its bytes, header info, the frames to decode, the decoder), every limit checked from the
    header before any decoding."""
    encoded = read_encoded(item, limits=limits)
    info = probe(encoded, limits=limits)
    indices = _sampled_indices(info, opts, limits, encoded.origin)
    check_decode_budget(encoded.origin, info, indices, limits)
    return encoded, info, indices, choose_decoder(opts.decoder, info)


def _encoded_video(item: MediaInput, opts: VideoOptions,
                   limits: MediaLimits) -> tuple[torch.Tensor, VideoMetadata, str]:
    """Encoded video -> (uint8 [T, 3, h, w] frames at the target size, metadata, source digest).

    Limits are checked from the header before any decoding; each frame is resized as it is decoded.
    """
    tp = opts.spec.temporal_patch_size
    encoded, info, indices, decoder = _open_video(item, opts, limits)

    def target(height: int, width: int) -> tuple[int, int]:
        return _frame_size(opts, len(indices), height, width)

    frames = decode_resized(encoded, indices, decoder, target, opts.backend, limits)  # [T, 3, h, w] uint8
    sample_fps = len(indices) / info.total_frames * info.fps
    meta = VideoMetadata(info.total_frames, info.fps, indices, sample_fps, tp / sample_fps, decoder)
    return frames, meta, encoded.digest


def _checked_frames(item: Sequence | np.ndarray | torch.Tensor, limits: MediaLimits) -> np.ndarray:
    """A video given as frames -> uint8 [T, H, W, 3], within the frame and pixel limits."""
    frames = _frame_list(item.cpu().numpy() if isinstance(item, torch.Tensor) else item)  # [T, H, W, 3]
    if len(frames) > limits.max_sampled_frames:
        raise MediaTooLargeError(f"video of {len(frames)} frames is over the limit of {limits.max_sampled_frames}")
    if frames.shape[1] * frames.shape[2] > limits.max_image_pixels:
        raise MediaTooLargeError(f"video frames of {frames.shape[2]}x{frames.shape[1]} are over the pixel limit")
    return frames


def _listed_video(item: Sequence | np.ndarray | torch.Tensor, opts: VideoOptions,
                  limits: MediaLimits) -> tuple[torch.Tensor, VideoMetadata, str]:
    """A video given as frames -> (uint8 [T, 3, h, w] frames at the target size, metadata, frames digest)."""
    tp = opts.spec.temporal_patch_size
    frames = _checked_frames(item, limits)  # [T, H, W, 3]
    n = len(frames)
    meta = VideoMetadata(n, opts.fps, list(range(n)), opts.fps, tp / opts.fps, "frames")
    height, width = frames.shape[1:3]
    size = _frame_size(opts, n, height, width)
    return _to_pixels(frames, size, opts.backend, opts.spec), meta, array_digest(frames)


def _omni_video(item: MediaInput, opts: VideoOptions, limits: MediaLimits) -> tuple[PackedTensor, VideoMetadata]:
    """Nemotron Omni: a one-item rows-form PackedTensor [n_tub*gh*gw, tp*3*p*p], num_frames before padding."""
    spec = opts.omni
    assert spec is not None
    if is_encoded(item):
        encoded, info, indices, decoder = _open_video(item, opts, limits)
        rows, grid = decode_omni(encoded, indices, decoder, spec, limits)
        meta, digest = VideoMetadata(info.total_frames, info.fps, indices, decoder=decoder), encoded.digest
    elif isinstance(item, (list, tuple, np.ndarray, torch.Tensor)):
        frames = _checked_frames(item, limits)  # [T, H, W, 3]
        rows, grid = omni_video_rows(torch.from_numpy(frames).permute(0, 3, 1, 2), spec)
        n = len(frames)
        meta, digest = VideoMetadata(n, opts.fps or 0.0, list(range(n)), decoder="frames"), array_digest(frames)
    else:
        raise MediaUnsupportedError(f"unsupported video input of type {type(item).__name__}")
    key = options_digest(digest, ("video", opts, meta.decoder))
    count = torch.tensor([len(meta.frame_indices)])
    return PackedTensor(rows, torch.tensor([grid]), count, [key]), meta


def process_video(item: MediaInput, opts: VideoOptions,
                  limits: MediaLimits = DEFAULT_LIMITS) -> tuple[PackedTensor, VideoMetadata]:
    """One video (encoded, or a list/array of frames) -> a one-item PackedTensor and its metadata."""
    _check_backend(opts.backend)
    if opts.omni is not None:
        return _omni_video(item, opts, limits)
    if is_encoded(item):
        frames, meta, digest = _encoded_video(item, opts, limits)
    elif isinstance(item, (list, tuple, np.ndarray, torch.Tensor)):
        frames, meta, digest = _listed_video(item, opts, limits)
    else:
        raise MediaUnsupportedError(f"unsupported video input of type {type(item).__name__}")
    key = options_digest(digest, ("video", opts, meta.decoder))
    return PackedTensor.from_frames([frames], [key], backend=opts.backend, spec=opts.spec), meta


def check_item_count(n: int, limits: MediaLimits) -> None:
    if n > limits.max_items:
        raise MediaTooLargeError(f"{n} media items in one call, over the limit of {limits.max_items}")


def preprocess_images(images: Sequence[MediaInput] | MediaInput, *, min_pixels: int | None = None,
                      max_pixels: int | None = None, backend: str = "torchvision", exif_transpose: bool = True,
                      limits: MediaLimits = DEFAULT_LIMITS, spec: PatchSpec = DEFAULT_SPEC,
                      omni: OmniImageSpec | None = None) -> PackedTensor:
    """Images (bytes, data URLs, paths, PIL images or uint8 arrays) -> PackedTensor, HF-bit-exact.

    `spec`: patch geometry and mean/std (PatchSpec.from_config of the checkpoint; Qwen2-VL's by default).
    `omni`: Nemotron Omni's processor instead (rows form; one patch budget for the call, as HF's)."""
    items = list(images) if isinstance(images, (list, tuple)) else [images]
    check_item_count(len(items), limits)
    opts = ImageOptions(min_pixels if min_pixels is not None else IMAGE_MIN_PIXELS,
                        max_pixels if max_pixels is not None else IMAGE_MAX_PIXELS, backend, exif_transpose, spec,
                        omni)
    return PackedTensor.concat([process_image(it, opts, limits, len(items)) for it in items])


def preprocess_videos(videos: Sequence[MediaInput] | MediaInput, *, sampler: str = "hf", fps: float | None = 2.0,
                      num_frames: int | None = None, frame_indices: Sequence[int] | None = None,
                      min_pixels: int | None = None, max_pixels: int | None = None, total_pixels: int | None = None,
                      decoder: str = "auto", backend: str = "torchvision", limits: MediaLimits = DEFAULT_LIMITS,
                      spec: PatchSpec = DEFAULT_SPEC, family: str = "qwen2", do_sample_frames: bool = True,
                      min_frames: int = QWEN_MIN_FRAMES, max_frames: int = QWEN_MAX_FRAMES,
                      omni: OmniVideoSpec | None = None) -> tuple[PackedTensor, list[VideoMetadata]]:
    """Videos (bytes, data URLs, paths, or lists/arrays of frames) -> (PackedTensor, metadata per video).

    Frames are picked as HF's Qwen2-VL video processor picks them with do_sample_frames=True (sampler="hf");
    "vllm", "qwen" (qwen-vl-utils) and "qwen3" are the other rules, frame_indices an explicit pick (docs/video.md).
    Qwen3-VL: family="qwen3", sampler="qwen3" and the checkpoint's spec, as its Qwen3VLVideoProcessor.
    Nemotron Omni: `omni` (its video processor, rows form), sampler="hf_base"."""
    items = [videos] if is_encoded(videos) or isinstance(videos, np.ndarray) else list(videos)
    check_item_count(len(items), limits)
    opts = VideoOptions(sampler, fps, num_frames, tuple(frame_indices) if frame_indices is not None else None,
                        min_pixels if min_pixels is not None else VIDEO_MIN_PIXELS,
                        max_pixels if max_pixels is not None else VIDEO_MAX_PIXELS, total_pixels, decoder, backend,
                        spec, family, do_sample_frames, min_frames, max_frames, omni)
    results = [process_video(it, opts, limits) for it in items]
    return PackedTensor.concat([p for p, _ in results]), [m for _, m in results]
