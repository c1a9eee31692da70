"""Media errors that carry the HTTP status a server should answer with."""

from __future__ import annotations


class MediaError(ValueError):
    """A media item could not be accepted; `.status` is the HTTP status to report."""

    status: int = 400

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class MediaDecodeError(MediaError):
    """Bytes that are not a decodable image or video, or are truncated (400)."""

    status = 400


class MediaUnsupportedError(MediaError):
    """A format or codec we do not decode (415)."""

    status = 415


class MediaTooLargeError(MediaError):
    """Too many bytes, pixels, frames, seconds or items (413)."""

    status = 413


class MediaInvalidError(MediaError):
    """Well-formed media that breaks a processing rule, such as an extreme aspect ratio (400)."""

    status = 400
