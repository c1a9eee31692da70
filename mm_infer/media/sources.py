"""Turn what callers hand us (bytes, data URLs, paths, PIL images, arrays) into one of two forms."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from mm_infer.media.errors import MediaDecodeError, MediaTooLargeError, MediaUnsupportedError
from mm_infer.media.limits import DEFAULT_LIMITS, MediaLimits

MediaInput = Any  # bytes | str | os.PathLike | PIL.Image.Image | np.ndarray | torch.Tensor | list of frames


@dataclass(frozen=True)
class EncodedMedia:
    """Encoded bytes with a digest of them, and where they came from (for error messages)."""

    data: bytes
    digest: str
    origin: str


def _digest(*chunks: bytes) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return h.hexdigest()


def decode_data_url(url: str, *, limits: MediaLimits = DEFAULT_LIMITS) -> bytes:
    """`data:<mime>;base64,<payload>` -> bytes; only base64 payloads are accepted."""
    header, sep, payload = url.partition(",")
    if not sep or not header.startswith("data:"):
        raise MediaDecodeError("malformed data URL: expected 'data:<mime>;base64,<payload>'")
    if not header.endswith(";base64"):
        raise MediaUnsupportedError(f"data URL '{header[:60]}' is not base64-encoded")
    if len(payload) * 3 // 4 > limits.max_bytes:
        raise MediaTooLargeError(
            f"data URL payload of ~{len(payload) * 3 // 4} bytes exceeds the limit of {limits.max_bytes} bytes")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise MediaDecodeError(f"data URL has an invalid base64 payload: {e}") from None


def read_encoded(item: EncodedMedia | bytes | bytearray | memoryview | str | os.PathLike, *,
                 limits: MediaLimits = DEFAULT_LIMITS) -> EncodedMedia:
    """Bytes, a data URL or a local path -> EncodedMedia, enforcing the byte limit."""
    if isinstance(item, EncodedMedia):
        data, origin = item.data, item.origin
    elif isinstance(item, (bytes, bytearray, memoryview)):
        data, origin = bytes(item), "bytes"
    elif isinstance(item, str) and item.startswith("data:"):
        data, origin = decode_data_url(item, limits=limits), "data URL"
    elif isinstance(item, (str, os.PathLike)):
        text = os.fspath(item)
        if text.startswith(("http://", "https://")):
            raise MediaUnsupportedError(
                f"remote URL '{text[:80]}' must be fetched by the caller (the server does this under its limits)")
        path = Path(text[len("file://"):] if text.startswith("file://") else text)
        try:
            size = path.stat().st_size
        except OSError as e:
            raise MediaDecodeError(f"cannot read media file '{path}': {e.strerror or e}") from None
        if size > limits.max_bytes:
            raise MediaTooLargeError(f"media file '{path}' has {size} bytes, over the limit of {limits.max_bytes}")
        data, origin = path.read_bytes(), f"file '{path}'"
    else:
        raise MediaUnsupportedError(f"unsupported media input of type {type(item).__name__}")
    if len(data) > limits.max_bytes:
        raise MediaTooLargeError(f"{origin} has {len(data)} bytes, over the limit of {limits.max_bytes}")
    if not data:
        raise MediaDecodeError(f"{origin} is empty (0 bytes)")
    return item if isinstance(item, EncodedMedia) else EncodedMedia(data, _digest(data), origin)


def is_encoded(item: object) -> bool:
    return isinstance(item, (EncodedMedia, bytes, bytearray, memoryview, str, os.PathLike))


def pil_digest(image: Image.Image) -> str:
    """Digest of a PIL image's decoded content (mode, size, pixels)."""
    return _digest(f"{image.mode}:{image.size}".encode(), image.tobytes())


def array_digest(array: np.ndarray) -> str:
    a = np.ascontiguousarray(array)
    return _digest(f"{a.dtype}:{a.shape}".encode(), a.tobytes())


def options_digest(content_digest: str, options: tuple) -> str:
    """Content hash of one processed item: its source digest plus the options that shaped it."""
    return _digest(content_digest.encode(), repr(options).encode())
