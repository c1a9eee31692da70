"""file:// media: only regular files under the allowed roots; directories, FIFOs and devices are a prompt 400."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from mm_infer.media import MediaTooLargeError
from servers.openai.bodies.errors import ApiError
from servers.openai.config import FetchConfig
from servers.openai.media.request_media import MediaFetcher


def fetch(config: FetchConfig, url: str) -> bytes:
    async def go() -> bytes:
        fetcher = MediaFetcher(config)
        try:
            return await fetcher.fetch(url)
        finally:
            await fetcher.aclose()
    return asyncio.run(go())


def test_directory_is_400(tmp_path: Path) -> None:
    """F12: a directory under the root used to raise IsADirectoryError (a 500)."""
    (tmp_path / "sub").mkdir()
    with pytest.raises(ApiError) as e:
        fetch(FetchConfig(allowed_media_paths=(tmp_path,)), f"file://{tmp_path}/sub")
    assert e.value.status == 400 and "not a regular file" in e.value.message
    with pytest.raises(ApiError, match="not a regular file"):
        fetch(FetchConfig(allowed_media_paths=(tmp_path,)), f"file://{tmp_path}")


def test_fifo_is_400_promptly(tmp_path: Path) -> None:
    """F15: opening a FIFO under the root blocked its request forever (until a writer came)."""
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    outcome: list[BaseException | bytes] = []

    def run() -> None:
        try:
            outcome.append(fetch(FetchConfig(allowed_media_paths=(tmp_path,)), f"file://{fifo}"))
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            outcome.append(e)
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=5)
    hung = worker.is_alive()
    if hung:  # unblock the reader, so a failing run does not hang the test session too
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(timeout=5)
    assert not hung, "reading a FIFO blocked"
    assert isinstance(outcome[0], ApiError) and outcome[0].status == 400
    assert "not a regular file" in outcome[0].message


def test_character_device_is_400() -> None:
    """/dev/null used to read as an empty file; a device is never media."""
    with pytest.raises(ApiError, match="not a regular file"):
        fetch(FetchConfig(allowed_media_paths=(Path("/dev"),)), "file:///dev/null")


@pytest.mark.parametrize("tail", ["/a%00b.png", "/missing.png"])
def test_unreadable_names_are_400(tmp_path: Path, tail: str) -> None:
    """A NUL byte in the path used to raise ValueError (a 500)."""
    with pytest.raises(ApiError) as e:
        fetch(FetchConfig(allowed_media_paths=(tmp_path,)), f"file://{tmp_path}{tail}")
    assert e.value.status == 400


def test_relative_file_url_is_400(tmp_path: Path) -> None:
    with pytest.raises(ApiError, match="absolute path"):
        fetch(FetchConfig(allowed_media_paths=(tmp_path,)), "file:relative.png")


def test_regular_file_read_and_capped(tmp_path: Path) -> None:
    (tmp_path / "ok.bin").write_bytes(b"x" * 100)
    assert fetch(FetchConfig(allowed_media_paths=(tmp_path,), max_bytes=100), f"file://{tmp_path}/ok.bin") == b"x" * 100
    with pytest.raises(MediaTooLargeError):
        fetch(FetchConfig(allowed_media_paths=(tmp_path,), max_bytes=99), f"file://{tmp_path}/ok.bin")
