"""Media pipeline: image and video bytes to PackedTensor, bit-exact with the HF Qwen2-VL processors."""

from mm_infer.media.errors import (
                                   MediaDecodeError,
                                   MediaError,
                                   MediaInvalidError,
                                   MediaTooLargeError,
                                   MediaUnsupportedError,
)
from mm_infer.media.item_processing import (
                                   ImageOptions,
                                   VideoMetadata,
                                   VideoOptions,
                                   preprocess_images,
                                   preprocess_videos,
                                   process_image,
                                   process_video,
)
from mm_infer.media.limits import DEFAULT_LIMITS, MediaLimits
from mm_infer.media.media_processor import MediaProcessor
from mm_infer.media.packed import PackedTensor
from mm_infer.media.resize import smart_resize

__all__ = [
    "DEFAULT_LIMITS", "ImageOptions", "MediaDecodeError", "MediaError", "MediaInvalidError", "MediaLimits",
    "MediaProcessor", "MediaTooLargeError", "MediaUnsupportedError", "PackedTensor", "VideoMetadata",
    "VideoOptions", "preprocess_images", "preprocess_videos", "process_image", "process_video", "smart_resize",
]
