"""Media for a request: check processing options, fetch and decode off the loop, cache by (uuid, content, options)."""

from __future__ import annotations

import asyncio
import hashlib
from contextvars import ContextVar
from typing import Any

from mm_infer.media import MediaError, MediaProcessor, MediaTooLargeError
from mm_infer.media.cache import ByteLRU
from mm_infer.prompt.audio import encoded_audio_item
from mm_infer.prompt.media import MediaDefaults
from mm_infer.prompt.request import MediaItem, items_from_packed
from servers.openai.bodies.errors import ApiError
from servers.openai.config import MediaCaps
from servers.openai.media.addresses import is_public_address
from servers.openai.media.fetch import MediaFetcher
from servers.openai.media.options import MediaOptions, media_options
from servers.openai.prompting.messages import MediaRef

__all__ = ["MediaFetcher", "MediaOptions", "MediaResolver", "is_public_address", "media_client_scope"]

# Who is asking, as the HTTP layer sets it per request (a digest of the API key, else the client address).
# A uuid sent without its URL is looked up only among the uuids this same scope stored.
media_client_scope: ContextVar[str] = ContextVar("media_client_scope", default="")

NAME_ENTRY_BYTES = 256  # what one (scope, uuid) -> content entry is charged in the name index
HASH_INLINE_BYTES = 1 << 20  # hash bigger payloads off the event loop

def _kind_options(kind: str, opts: MediaOptions) -> tuple[tuple[str, Any], ...]:
    return {"image": opts.image, "video": opts.video}.get(kind, ())  # audio takes no request options


def _digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _name_key(scope: str, ref: MediaRef, opts: MediaOptions) -> str:
    return _digest(scope, ref.kind, ref.uuid, _kind_options(ref.kind, opts))


def _content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class MediaResolver:
    """Fetch and decode a request's media under the server's caps; reuse decodes named by uuid.

    Decoded items are keyed by (kind, uuid, sha256 of the bytes sent, options), so a uuid never stands
    in for different bytes: a request that sends a URL with its uuid is always fetched, and the cache
    only saves the decode when the bytes hash the same. A uuid sent alone is served only when the same
    client scope (`media_client_scope`) stored it with the same options; otherwise it is a 400.
    """

    def __init__(self, fetcher: MediaFetcher, processor: MediaProcessor, defaults: MediaDefaults,
                 caps: MediaCaps) -> None:
        self.fetcher = fetcher
        self.processor = processor
        self.caps = caps
        self.defaults = defaults
        self._by_content: ByteLRU[MediaItem] = ByteLRU(caps.uuid_cache_bytes)
        self._by_name: ByteLRU[str] = ByteLRU(caps.uuid_name_entries * NAME_ENTRY_BYTES)

    @property
    def uuid_hits(self) -> int:
        return self._by_content.hits

    def options(self, kwargs: dict[str, Any] | None, media_io_kwargs: dict[str, Any] | None = None) -> MediaOptions:
        """Check mm_processor_kwargs and media_io_kwargs: known keys only, never above the server caps (400)."""
        return media_options(kwargs, media_io_kwargs, self.caps, self.defaults)

    def _named(self, ref: MediaRef, opts: MediaOptions, scope: str) -> MediaItem:
        """The item this scope stored under ref.uuid with these options (400 when there is none)."""
        key = self._by_name.get(_name_key(scope, ref, opts))
        item = self._by_content.get(key) if key is not None else None
        if item is None:
            raise ApiError(400, f"no cached {ref.kind} for uuid {ref.uuid!r} from this client with these "
                           "mm_processor_kwargs; send its URL again", param="uuid")
        return item

    async def _audio(self, ref: MediaRef, data: bytes) -> tuple[MediaItem, int]:
        """Audio bytes -> the features item (a 400 naming the part for undecodable or too short audio)."""
        where = ref.where or "audio"
        if self.defaults.audio is None:
            raise ApiError(400, f"{where}: audio input is not served for this model (no audio tower)", param=where)
        try:
            item = await asyncio.to_thread(encoded_audio_item, data, self.defaults.audio)
        except MediaError as e:
            raise ApiError(e.status, f"{where}: {e}", param=where) from None
        return item, item.nbytes

    async def _decode(self, ref: MediaRef, data: bytes, opts: MediaOptions) -> tuple[MediaItem, int]:
        kind = ref.kind
        if kind == "audio":
            return await self._audio(ref, data)
        overrides = dict(_kind_options(kind, opts))
        packed, metas = await self.processor.aprocess(kind, [data], **overrides)
        seconds = None if kind == "image" else [float(metas[0].second_per_grid_ts or 0.0)]
        stamps = None if kind == "image" else self.defaults.timestamps(metas)  # Qwen3-VL's "<t seconds>"
        frames = None if kind == "image" else [list(metas[0].frame_indices)]
        return items_from_packed(kind, packed, seconds, stamps, frames)[0], packed.nbytes

    async def _one(self, ref: MediaRef, opts: MediaOptions) -> MediaItem:
        scope = media_client_scope.get()
        if ref.url is None:
            return self._named(ref, opts, scope)
        data = await self.fetcher.fetch(ref.url)
        if not ref.uuid:
            return (await self._decode(ref, data, opts))[0]
        small = len(data) <= HASH_INLINE_BYTES
        content = _content_hash(data) if small else await asyncio.to_thread(_content_hash, data)
        key = _digest(ref.kind, ref.uuid, content, _kind_options(ref.kind, opts))
        item = self._by_content.get(key)
        if item is None:
            item, nbytes = await self._decode(ref, data, opts)
            self._by_content.put(key, item, nbytes)
        self._by_name.put(_name_key(scope, ref, opts), key, NAME_ENTRY_BYTES)
        return item

    async def resolve(self, refs: list[MediaRef], opts: MediaOptions) -> list[MediaItem]:
        """The prompt's media items, fetched and decoded concurrently, in prompt order."""
        if len(refs) > self.processor.limits.max_items:
            raise MediaTooLargeError(f"{len(refs)} media items, over the limit of {self.processor.limits.max_items}")
        if not refs:  # text only: no gather (and no task switch) at all
            return []
        return list(await asyncio.gather(*(self._one(r, opts) for r in refs)))
