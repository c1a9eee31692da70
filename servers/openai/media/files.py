"""file:// media: regular files under the allowed roots only, opened without blocking, read under the byte cap."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

from mm_infer.media import MediaTooLargeError
from servers.openai.bodies.errors import ApiError

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _local_path(url: str, roots: tuple[Path, ...]) -> Path:
    """The resolved path a file URL names, once it is known to lie under one of the roots."""
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ApiError(400, f"file URL with a remote host {parts.netloc!r} is not accepted", param="url")
    raw = unquote(parts.path)
    if not raw.startswith("/") or "\x00" in raw:
        raise ApiError(400, "file URL must name an absolute path (file:///dir/name)", param="url")
    try:
        path = Path(raw).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop, an unreadable component
        raise ApiError(400, f"cannot resolve media file path: {e}", param="url") from None
    if not any(path.is_relative_to(root) for root in roots):
        raise ApiError(403, "file URLs are only served from the folders given by --allowed-media-path"
                       if roots else "file URLs are disabled (start the server with --allowed-media-path)",
                       param="url")
    return path


def _check_regular(mode: int, size: int, name: str, max_bytes: int) -> None:
    if not stat.S_ISREG(mode):
        raise ApiError(400, f"media file {name!r} is not a regular file", param="url")
    if size > max_bytes:
        raise MediaTooLargeError(f"media file has {size} bytes, over the limit of {max_bytes}")


def read_media_file(url: str, roots: tuple[Path, ...], max_bytes: int) -> bytes:
    """The bytes of a file URL: 403 outside the roots, 400 for anything but a readable regular file."""
    path = _local_path(url, roots)
    try:
        st = os.stat(path)
        _check_regular(st.st_mode, st.st_size, path.name, max_bytes)
        fd = os.open(path, _OPEN_FLAGS)  # O_NONBLOCK: a FIFO swapped in after the stat cannot hang us
    except OSError as e:
        raise ApiError(400, f"cannot read media file {path.name!r}: {e.strerror or e}", param="url") from None
    try:
        st = os.fstat(fd)  # the file we opened, not the one we looked at
        _check_regular(st.st_mode, st.st_size, path.name, max_bytes)
        chunks, total = [], 0
        while chunk := os.read(fd, min(1 << 20, max_bytes + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:  # the file grew after the size check
                raise MediaTooLargeError(f"media file has more than the limit of {max_bytes} bytes")
        return b"".join(chunks)
    except OSError as e:
        raise ApiError(400, f"cannot read media file {path.name!r}: {e.strerror or e}", param="url") from None
    finally:
        os.close(fd)
