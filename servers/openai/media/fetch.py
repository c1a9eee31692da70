"""MediaFetcher: the bytes behind a media URL (data:, file://, http(s)://) under SSRF rules, a byte cap, a deadline."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path
from urllib.parse import SplitResult, urlsplit, urlunsplit

import httpx

from mm_infer.media import MediaTooLargeError
from mm_infer.media.limits import MediaLimits
from mm_infer.media.sources import decode_data_url
from servers.openai.bodies.errors import ApiError
from servers.openai.config import FetchConfig
from servers.openai.media.addresses import check_host_form, is_public_address
from servers.openai.media.files import read_media_file

INLINE_DATA_URL_CHARS = 1 << 16  # base64 data URLs up to this long decode on the event loop, longer ones on a thread


def _split_http(url: str) -> tuple[SplitResult, str, int]:
    """The URL's parts, host and port, or a 400 naming what is malformed."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError as e:  # "Port out of range", "Invalid IPv6 URL"
        raise ApiError(400, f"malformed media URL: {e}", param="url") from None
    if not parts.hostname:
        raise ApiError(400, "media URL has no host", param="url")
    check_host_form(parts.hostname)
    return parts, parts.hostname, port


class MediaFetcher:
    """Fetch one media URL at a time (call concurrently); every path enforces the byte cap."""

    def __init__(self, config: FetchConfig, client: httpx.AsyncClient | None = None,
                 address_allowed: Callable[[str], bool] = is_public_address) -> None:
        self.config = config
        self.address_allowed = address_allowed
        self.roots = tuple(Path(p).resolve() for p in config.allowed_media_paths)
        self._client = client
        self._limits = MediaLimits(max_bytes=config.max_bytes)

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False, timeout=self.config.timeout_s, trust_env=False)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def fetch(self, url: str) -> bytes:
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme == "data":
            if len(url) <= INLINE_DATA_URL_CHARS:  # small: decoding costs less than the hop to a thread
                return decode_data_url(url, limits=self._limits)
            return await asyncio.to_thread(decode_data_url, url, limits=self._limits)
        if scheme == "file":
            return await asyncio.to_thread(read_media_file, url, self.roots, self.config.max_bytes)
        if scheme in ("http", "https"):
            return await self._fetch_http(url)
        raise ApiError(400, f"unsupported media URL scheme {scheme!r}: use data:, file:// or http(s)://",
                       param="url")

    async def _pin(self, host: str, port: int) -> str | None:
        """The checked address to connect to (None when private addresses are allowed: no check, no pin)."""
        if self.config.allow_private_urls:
            return None
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            raise ApiError(400, f"cannot resolve media host {host!r}: {e}", param="url") from None
        addresses = [str(info[4][0]) for info in infos]
        if not addresses or not all(self.address_allowed(a) for a in addresses):
            raise ApiError(403, f"media host {host!r} resolves to a private, loopback or reserved address",
                           param="url")
        return sorted(addresses, key=lambda a: ":" in a)[0]  # IPv4 first: not every host answers on IPv6

    async def _fetch_http(self, url: str) -> bytes:
        """One GET under a wall-clock deadline covering resolve, connect, headers and every body chunk."""
        if not self.config.allow_remote_urls:
            raise ApiError(403, "http(s) media URLs are disabled on this server", param="url")
        parts, host, port = _split_http(url)
        try:
            async with asyncio.timeout(self.config.timeout_s):
                return await self._get(url, parts, host, port)
        except (TimeoutError, httpx.TimeoutException):
            raise ApiError(400, f"fetching the media URL timed out after {self.config.timeout_s}s "
                           "(--media-fetch-timeout bounds the whole download)", param="url") from None
        except httpx.InvalidURL as e:
            raise ApiError(400, f"malformed media URL: {e}", param="url") from None
        except httpx.HTTPError as e:
            raise ApiError(400, f"fetching the media URL failed: {type(e).__name__}", param="url") from None

    async def _get(self, url: str, parts: SplitResult, host: str, port: int) -> bytes:
        address = await self._pin(host, port)
        headers: dict[str, str] = {}
        extensions: dict[str, str] = {}
        if address is not None:  # connect to the address we checked, so a second DNS answer cannot differ
            netloc = (f"[{address}]" if ":" in address else address) + (f":{parts.port}" if parts.port else "")
            headers["Host"] = parts.netloc.rsplit("@", 1)[-1]
            extensions["sni_hostname"] = host
            url = urlunsplit(parts._replace(netloc=netloc))
        cap = self.config.max_bytes
        async with self.client.stream("GET", url, headers=headers, extensions=extensions) as resp:
            if resp.is_redirect:
                raise ApiError(400, f"media URL answered a redirect (HTTP {resp.status_code}); redirects "
                               "are not followed", param="url")
            if resp.status_code != 200:
                raise ApiError(400, f"fetching the media URL returned HTTP {resp.status_code}", param="url")
            declared = resp.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > cap:
                raise MediaTooLargeError(f"media URL declares {declared} bytes, over the limit of {cap}")
            chunks, total = [], 0
            async for chunk in resp.aiter_bytes():
                total += len(chunk)
                if total > cap:
                    raise MediaTooLargeError(f"media URL sent more than the limit of {cap} bytes")
                chunks.append(chunk)
        return b"".join(chunks)
