"""Media for a prompt: the checkpoint's defaults, the per-request option names, and sources -> MediaItems."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mm_infer.config import MediaConfig
from mm_infer.media.frame_sampling import QWEN_MAX_FRAMES, QWEN_MIN_FRAMES, SAMPLERS, frame_timestamps
from mm_infer.media.item_processing import ImageOptions, VideoMetadata, VideoOptions
from mm_infer.media.omni_audio import AudioFeatureSpec
from mm_infer.media.omni_image import OMNI_IMAGE_PROCESSOR, OmniImageSpec
from mm_infer.media.omni_video import OMNI_VIDEO_PROCESSOR, OmniVideoSpec, frame_seconds
from mm_infer.media.packed import PackedTensor
from mm_infer.media.patchify import DEFAULT_SPEC, PatchSpec
from mm_infer.prompt.mrope import MROPE_RULES
from mm_infer.prompt.placeholders import PromptError
from mm_infer.prompt.request import MediaItem, items_from_packed

# The one table of media processing keys (mm_processor_kwargs names): each key's modality, and whether a request
# over HTTP may set it (the others are for library callers: decoders and backends, already processed inputs). The
# server checks a request against this table and its caps; `image_overrides` / `video_overrides` apply defaults once.
MEDIA_KEYS: dict[str, tuple[str, bool]] = {
    "min_pixels": ("image", True), "max_pixels": ("image", True),
    "backend": ("image", False), "exif_transpose": ("image", False),
    "fps": ("video", True), "num_frames": ("video", True), "frame_indices": ("video", True),
    "total_pixels": ("video", True), "sampler": ("video", True), "do_sample_frames": ("video", True),
    "video_min_pixels": ("video", True), "video_max_pixels": ("video", True),
    "decoder": ("video", False), "second_per_grid_ts": ("video", False),
}
IMAGE_KWARGS = frozenset(k for k, (modality, _) in MEDIA_KEYS.items() if modality == "image")
VIDEO_KWARGS = frozenset(k for k, (modality, _) in MEDIA_KEYS.items() if modality == "video")
REQUEST_KWARGS = frozenset(k for k, (_, by_request) in MEDIA_KEYS.items() if by_request)
VIDEO_OPTION_KWARGS = ("num_frames", "total_pixels", "sampler", "decoder", "do_sample_frames")  # VideoOptions' names
QWEN3_VIDEO_PROCESSOR = "Qwen3VLVideoProcessor"


@dataclass(frozen=True)
class MediaDefaults:
    image_min_pixels: int | None
    image_max_pixels: int | None
    video_min_pixels: int | None
    video_max_pixels: int | None
    video_fps: float
    temporal_patch_size: int = 2
    spec: PatchSpec = DEFAULT_SPEC  # patch geometry and mean/std of preprocessor_config.json
    qwen3_video: bool = False  # Qwen3VLVideoProcessor: its sampling, clip-level resize and frame timestamps
    video_sampler: str = "hf"  # the checkpoint's HF video processor's rule ("qwen3" for Qwen3-VL)
    video_min_frames: int = QWEN_MIN_FRAMES
    video_max_frames: int = QWEN_MAX_FRAMES
    omni_image: OmniImageSpec | None = None  # Nemotron Omni's processors (preprocessor_config.json's type)
    omni_video: OmniVideoSpec | None = None
    audio: AudioFeatureSpec | None = None  # Nemotron Omni with an audio tower: its feature extractor, else None
    model_name: str = "this model"  # how an error names the checkpoint

    @property
    def video_family(self) -> str:
        return "omni" if self.omni_video else "qwen3" if self.qwen3_video else "qwen2"

    def processor_options(self) -> tuple[ImageOptions, VideoOptions]:
        """Base options of a MediaProcessor for this checkpoint (callers override the pixel bounds)."""
        video = VideoOptions(sampler=self.video_sampler, fps=self.video_fps, spec=self.spec, family=self.video_family,
                             min_frames=self.video_min_frames, max_frames=self.video_max_frames)
        if (omni := self.omni_video) is not None:  # the checkpoint's sampling (HF: only with do_sample_frames)
            video = replace(video, fps=omni.fps, num_frames=omni.num_frames, do_sample_frames=omni.do_sample_frames,
                            omni=omni)
        return ImageOptions(spec=self.spec, omni=self.omni_image), video

    def timestamps(self, metas: list[VideoMetadata]) -> list[list[float] | None] | None:
        """Where the prompt writes times: each video's temporal-patch seconds (Qwen3-VL), each frame's seconds
        (Nemotron Omni; None without an fps), else None."""
        if self.omni_video is not None:
            return [frame_seconds(m.frame_indices, m.fps, m.decoder == "frames") for m in metas]
        return [m.timestamps(self.temporal_patch_size) for m in metas] if self.qwen3_video else None


def _pixels(cfg: Mapping[str, Any]) -> tuple[int | None, int | None]:
    size = cfg.get("size") or {}
    return (cfg.get("min_pixels", size.get("shortest_edge")), cfg.get("max_pixels", size.get("longest_edge")))


def media_defaults(model_dir: str | Path, media: MediaConfig, *, audio_tower: bool = False) -> MediaDefaults:
    """Engine options first, then preprocessor_config.json / video_preprocessor_config.json; with `audio_tower`,
    the audio feature extractor of processor_config.json (ParakeetFeatureExtractor's defaults where it is silent)."""
    def read(name: str) -> dict[str, Any]:
        path = Path(model_dir) / name
        return json.loads(path.read_text()) if path.exists() else {}

    image, video = read("preprocessor_config.json"), read("video_preprocessor_config.json") or {}
    (imin, imax), (vmin, vmax) = _pixels(image), _pixels(video or image)
    qwen3 = video.get("video_processor_type") == QWEN3_VIDEO_PROCESSOR
    omni_image = OmniImageSpec.from_config(image) if image.get("image_processor_type") == OMNI_IMAGE_PROCESSOR else None
    omni_video = OmniVideoSpec.from_config(video) if video.get("video_processor_type") == OMNI_VIDEO_PROCESSOR else None
    sampler = media.video_sampler or ("qwen3" if qwen3 else "hf_base" if omni_video else "hf")
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown video_sampler {sampler!r}, expected one of {SAMPLERS}")
    if media.mrope_after_video not in MROPE_RULES:
        raise ValueError(f"unknown mrope_after_video {media.mrope_after_video!r}, expected one of {MROPE_RULES}")
    return MediaDefaults(
        media.image_min_pixels or imin, media.image_max_pixels or imax, media.video_min_pixels or vmin,
        media.video_max_pixels or vmax, float(video.get("fps") or media.video_fps),
        int(image.get("temporal_patch_size", 2)), PatchSpec.from_config(image), qwen3, sampler,
        int(video.get("min_frames", QWEN_MIN_FRAMES)), int(video.get("max_frames", QWEN_MAX_FRAMES)), omni_image,
        omni_video, AudioFeatureSpec.from_config(read("processor_config.json")) if audio_tower else None,
        Path(model_dir).name)


def image_overrides(kw: Mapping[str, Any], d: MediaDefaults) -> dict[str, Any]:
    """ImageOptions fields for these kwargs: the request's pixel bounds over the checkpoint's."""
    return {"min_pixels": kw.get("min_pixels", d.image_min_pixels),
            "max_pixels": kw.get("max_pixels", d.image_max_pixels),
            **{k: kw[k] for k in ("backend", "exif_transpose") if k in kw}}


def video_overrides(kw: Mapping[str, Any], d: MediaDefaults) -> dict[str, Any]:
    """VideoOptions fields for these kwargs: video_min/max_pixels become the options' min/max_pixels, fps and the
    pixel bounds fall back to the checkpoint's, the other keys pass when given. Nemotron Omni samples only with
    do_sample_frames (the checkpoint's), or when the request names fps or num_frames (as a Qwen request would)."""
    fps = kw.get("fps", d.video_fps if d.omni_video is None else d.omni_video.fps)
    out = {"min_pixels": kw.get("video_min_pixels", d.video_min_pixels),
           "max_pixels": kw.get("video_max_pixels", d.video_max_pixels), "fps": None if fps is None else float(fps),
           **{k: kw[k] for k in VIDEO_OPTION_KWARGS if k in kw}}
    if d.omni_video is not None and "do_sample_frames" not in kw and ("fps" in kw or "num_frames" in kw):
        out["do_sample_frames"] = True
    if "frame_indices" in kw:
        out["frame_indices"] = tuple(kw["frame_indices"])
    return out


def _as_list(x: Any) -> list[Any]:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def image_items(sources: Any, kw: Mapping[str, Any], d: MediaDefaults) -> list[MediaItem]:
    """Images (sources, or an already processed PackedTensor) -> one MediaItem each, in order."""
    if isinstance(sources, PackedTensor):
        return items_from_packed("image", sources)
    from mm_infer.media import preprocess_images

    packed = preprocess_images(_as_list(sources), spec=d.spec, omni=d.omni_image, **image_overrides(kw, d))
    return items_from_packed("image", packed)


def video_items(sources: Any, kw: Mapping[str, Any], d: MediaDefaults) -> list[MediaItem]:
    """Videos (sources, or a PackedTensor with `second_per_grid_ts` in kw) -> one MediaItem each, in order."""
    fps = float(kw.get("fps", d.video_fps))
    if isinstance(sources, PackedTensor):
        seconds = kw.get("second_per_grid_ts", [d.temporal_patch_size / fps] * len(sources))
        seconds = [float(s) for s in _as_list(seconds)]
        if len(seconds) != len(sources):
            raise PromptError(f"{len(seconds)} second_per_grid_ts values for {len(sources)} videos")
        stamps = ([frame_timestamps(list(range(int(n))), fps, d.temporal_patch_size) for n in sources.num_frames]
                  if d.qwen3_video else None)  # frames taken as sampled at `fps`
        return items_from_packed("video", sources, seconds, stamps)
    from mm_infer.media import preprocess_videos

    opts = {"sampler": d.video_sampler, **video_overrides(kw, d)}
    if d.omni_video is not None:
        opts = {"num_frames": d.omni_video.num_frames, "do_sample_frames": d.omni_video.do_sample_frames, **opts}
    packed, meta = preprocess_videos(_as_list(sources), spec=d.spec, family=d.video_family,
                                     min_frames=d.video_min_frames, max_frames=d.video_max_frames,
                                     omni=d.omni_video, **opts)
    return items_from_packed("video", packed, [m.second_per_grid_ts for m in meta], d.timestamps(meta),
                             [m.frame_indices for m in meta])
