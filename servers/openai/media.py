"""Media for a request: fetch bytes under limits (SSRF checks, timeouts), decode them into MediaItems off the loop."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx

from mm_infer.media import MediaProcessor, MediaTooLargeError
from mm_infer.media.cache import ByteLRU
from mm_infer.media.limits import MediaLimits
from mm_infer.media.sources import decode_data_url
from mm_infer.prompt.media import MediaDefaults
from mm_infer.prompt.request import MediaItem, items_from_packed
from servers.openai.config import FetchConfig, MediaCaps
from servers.openai.messages import MediaRef
from servers.openai.replies import ApiError


def is_public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


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
            return await asyncio.to_thread(decode_data_url, url, limits=self._limits)
        if scheme == "file":
            return await asyncio.to_thread(self._read_file, url)
        if scheme in ("http", "https"):
            return await self._fetch_http(url)
        raise ApiError(400, f"unsupported media URL scheme {scheme!r}: use data:, file:// or http(s)://",
                       param="url")

    def _read_file(self, url: str) -> bytes:
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ApiError(400, f"file URL with a remote host {parts.netloc!r} is not accepted", param="url")
        path = Path(unquote(parts.path)).resolve()
        if not any(path.is_relative_to(root) for root in self.roots):
            raise ApiError(403, "file URLs are only served from the folders given by --allowed-media-path"
                           if self.roots else "file URLs are disabled (start the server with --allowed-media-path)",
                           param="url")
        try:
            size = path.stat().st_size
        except OSError as e:
            raise ApiError(400, f"cannot read media file {path.name!r}: {e.strerror or e}", param="url") from None
        if size > self.config.max_bytes:
            raise MediaTooLargeError(f"media file has {size} bytes, over the limit of {self.config.max_bytes}")
        return path.read_bytes()

    async def _pin(self, host: str, port: int) -> str | None:
        """The checked address to connect to (None when private addresses are allowed: no check, no pin)."""
        if self.config.allow_private_urls:
            return None
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            raise ApiError(400, f"cannot resolve media host {host!r}: {e}", param="url") from None
        addresses = [str(info[4][0]) for info in infos]
        if not addresses or not all(self.address_allowed(a) for a in addresses):
            raise ApiError(403, f"media host {host!r} resolves to a private, loopback or reserved address",
                           param="url")
        return sorted(addresses, key=lambda a: ":" in a)[0]  # IPv4 first: not every host answers on IPv6

    async def _fetch_http(self, url: str) -> bytes:
        if not self.config.allow_remote_urls:
            raise ApiError(403, "http(s) media URLs are disabled on this server", param="url")
        parts = urlsplit(url)
        if not parts.hostname:
            raise ApiError(400, "media URL has no host", param="url")
        address = await self._pin(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        headers: dict[str, str] = {}
        extensions: dict[str, str] = {}
        if address is not None:  # connect to the address we checked, so a second DNS answer cannot differ
            netloc = (f"[{address}]" if ":" in address else address) + (f":{parts.port}" if parts.port else "")
            headers["Host"] = parts.netloc.rsplit("@", 1)[-1]
            extensions["sni_hostname"] = parts.hostname
            url = urlunsplit(parts._replace(netloc=netloc))
        cap = self.config.max_bytes
        try:
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
        except httpx.TimeoutException:
            raise ApiError(400, f"fetching the media URL timed out after {self.config.timeout_s}s",
                           param="url") from None
        except httpx.HTTPError as e:
            raise ApiError(400, f"fetching the media URL failed: {type(e).__name__}", param="url") from None
        return b"".join(chunks)


IMAGE_KEYS = {"min_pixels", "max_pixels"}
VIDEO_KEYS = {"fps", "num_frames", "video_min_pixels", "video_max_pixels", "total_pixels"}


@dataclass(frozen=True)
class MediaOptions:
    """Per-request processing options after checking them against the server caps."""

    image: tuple[tuple[str, Any], ...]
    video: tuple[tuple[str, Any], ...]


class MediaResolver:
    """Fetch, decode and cache (by uuid) a request's media under the server's caps."""

    def __init__(self, fetcher: MediaFetcher, processor: MediaProcessor, defaults: MediaDefaults,
                 caps: MediaCaps) -> None:
        self.fetcher = fetcher
        self.processor = processor
        self.caps = caps
        self.image_max = caps.image_max_pixels or defaults.image_max_pixels
        self.video_max = caps.video_max_pixels or defaults.video_max_pixels
        self.max_fps = caps.max_video_fps or defaults.video_fps
        self.defaults = defaults
        self._by_uuid: ByteLRU[MediaItem] = ByteLRU(caps.uuid_cache_bytes)

    @property
    def uuid_hits(self) -> int:
        return self._by_uuid.hits

    def options(self, kwargs: dict[str, Any] | None) -> MediaOptions:
        """Check mm_processor_kwargs: known keys only, and never above the server caps (400 otherwise)."""
        kw = dict(kwargs or {})
        if unknown := sorted(set(kw) - IMAGE_KEYS - VIDEO_KEYS):
            raise ApiError(400, f"unrecognized mm_processor_kwargs: {', '.join(unknown)}",
                           param="mm_processor_kwargs")
        limits = {"max_pixels": self.image_max, "min_pixels": self.image_max, "video_max_pixels": self.video_max,
                  "video_min_pixels": self.video_max, "total_pixels": None,
                  "num_frames": self.caps.max_video_frames, "fps": self.max_fps}
        for key, value in kw.items():
            kind = (int, float) if key == "fps" else int
            if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:
                raise ApiError(400, f"mm_processor_kwargs.{key} must be a positive "
                               f"{'number' if key == 'fps' else 'integer'}", param=f"mm_processor_kwargs.{key}")
            cap = limits[key]
            if cap is not None and value > cap:
                raise ApiError(400, f"mm_processor_kwargs.{key}={value} is above this server's cap of {cap}",
                               param=f"mm_processor_kwargs.{key}")
        image = {"min_pixels": kw.get("min_pixels", self.defaults.image_min_pixels),
                 "max_pixels": kw.get("max_pixels", self.image_max)}
        video = {"min_pixels": kw.get("video_min_pixels", self.defaults.video_min_pixels),
                 "max_pixels": kw.get("video_max_pixels", self.video_max), "fps": float(kw.get("fps", self.max_fps)),
                 "num_frames": kw.get("num_frames"), "total_pixels": kw.get("total_pixels")}
        for name, opts in (("image", image), ("video", video)):
            if opts["min_pixels"] and opts["max_pixels"] and opts["min_pixels"] > opts["max_pixels"]:
                raise ApiError(400, f"{name} min_pixels ({opts['min_pixels']}) is above max_pixels "
                               f"({opts['max_pixels']})", param="mm_processor_kwargs")
        return MediaOptions(tuple(sorted(image.items())), tuple(sorted(video.items())))

    async def _one(self, ref: MediaRef, opts: MediaOptions) -> MediaItem:
        key = f"{ref.kind}|{ref.uuid}|{opts!r}"
        if ref.uuid and (hit := self._by_uuid.get(key)) is not None:
            return hit
        if ref.url is None:
            raise ApiError(400, f"no cached {ref.kind} for uuid {ref.uuid!r}; send its URL again", param="uuid")
        data = await self.fetcher.fetch(ref.url)
        overrides = dict(opts.image if ref.kind == "image" else opts.video)
        packed, metas = await self.processor.aprocess(ref.kind, [data], **overrides)
        seconds = None if ref.kind == "image" else [float(metas[0].second_per_grid_ts or 0.0)]
        item = items_from_packed(ref.kind, packed, seconds)[0]
        if ref.uuid:
            self._by_uuid.put(key, item, packed.pixel_values.nbytes)
        return item

    async def resolve(self, refs: list[MediaRef], opts: MediaOptions) -> list[MediaItem]:
        """The prompt's media items, fetched and decoded concurrently, in prompt order."""
        if len(refs) > self.processor.limits.max_items:
            raise MediaTooLargeError(f"{len(refs)} media items, over the limit of {self.processor.limits.max_items}")
        return list(await asyncio.gather(*(self._one(r, opts) for r in refs)))
