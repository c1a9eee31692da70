"""The media uuid cache: keyed by (uuid, bytes sent, options) and, for a uuid sent alone, by the client scope."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from server_cases import MEDIA, SMALL, data_url

from mm_infer.media import MediaProcessor
from mm_infer.prompt.media import MediaDefaults
from mm_infer.prompt.request import MediaItem
from servers.openai.bodies.errors import ApiError
from servers.openai.config import FetchConfig, MediaCaps
from servers.openai.media.request_media import MediaFetcher, MediaResolver, media_client_scope
from servers.openai.prompting.messages import MediaRef

PHOTO = data_url(MEDIA / "images" / "photo.png", "image/png")
GRAY = data_url(MEDIA / "images" / "gray.png", "image/png")
DEFAULTS = MediaDefaults(image_min_pixels=None, image_max_pixels=SMALL, video_min_pixels=None,
                         video_max_pixels=SMALL, video_fps=2.0)


class Counting:
    """Counts calls to an async method of an object, then passes them through."""

    def __init__(self, target: object, name: str) -> None:
        self.calls = 0
        inner: Callable[..., Awaitable[Any]] = getattr(target, name)

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await inner(*args, **kwargs)
        setattr(target, name, counted)


@pytest.fixture
def resolver() -> Iterator[MediaResolver]:
    processor = MediaProcessor(max_workers=1, cache_bytes=0)  # no second cache hiding what this one does
    yield MediaResolver(MediaFetcher(FetchConfig()), processor, DEFAULTS, MediaCaps())
    processor.close()


def resolve(resolver: MediaResolver, scope: str, url: str | None, uuid: str | None,
            kwargs: dict[str, Any] | None = None) -> MediaItem:
    async def go() -> MediaItem:
        media_client_scope.set(scope)
        return (await resolver.resolve([MediaRef("image", url, uuid)], resolver.options(kwargs)))[0]
    return asyncio.run(go())


def test_scope_var_defaults_to_empty() -> None:
    assert media_client_scope.get() == ""


def test_same_uuid_with_other_bytes_gets_its_own_bytes(resolver: MediaResolver) -> None:
    """F6: a second client reusing a uuid with different bytes used to get the first client's image."""
    photo = resolve(resolver, "alice", PHOTO, "img-1")
    gray = resolve(resolver, "mallory", GRAY, "img-1")
    assert gray.content_hash != photo.content_hash
    assert gray.content_hash == resolve(resolver, "mallory", GRAY, None).content_hash
    assert resolve(resolver, "alice", None, "img-1").content_hash == photo.content_hash  # alice's name kept


def test_uuid_alone_from_another_scope_is_400(resolver: MediaResolver) -> None:
    """F6: a uuid alone used to read any client's cached image."""
    resolve(resolver, "alice", PHOTO, "img-1")
    with pytest.raises(ApiError) as e:
        resolve(resolver, "mallory", None, "img-1")
    assert e.value.status == 400 and e.value.param == "uuid"
    with pytest.raises(ApiError):
        resolve(resolver, "", None, "img-1")


def test_uuid_alone_in_the_same_scope_is_served(resolver: MediaResolver) -> None:
    first = resolve(resolver, "alice", PHOTO, "img-1")
    hits = resolver.uuid_hits
    again = resolve(resolver, "alice", None, "img-1")
    assert resolver.uuid_hits == hits + 1
    assert again.content_hash == first.content_hash and again.pixel_values.equal(first.pixel_values)


def test_url_with_uuid_is_fetched_again_and_hashed(resolver: MediaResolver) -> None:
    """F6: a URL with a known uuid used to skip the fetch; now it is fetched, and a hash match saves the decode."""
    fetches = Counting(resolver.fetcher, "fetch")
    decodes = Counting(resolver.processor, "aprocess")
    resolve(resolver, "alice", PHOTO, "img-1")
    resolve(resolver, "bob", PHOTO, "img-1")
    assert (fetches.calls, decodes.calls) == (2, 1)
    assert resolve(resolver, "bob", None, "img-1").content_hash  # bob sent the bytes, so bob may name them
    resolve(resolver, "alice", GRAY, "img-1")
    assert (fetches.calls, decodes.calls) == (3, 2)  # the uuid alone fetched nothing


def test_uuid_alone_needs_the_same_options(resolver: MediaResolver) -> None:
    resolve(resolver, "alice", PHOTO, "img-1")
    with pytest.raises(ApiError, match="uuid 'img-1'"):
        resolve(resolver, "alice", None, "img-1", {"max_pixels": SMALL // 2})
    small = resolve(resolver, "alice", PHOTO, "img-1", {"max_pixels": SMALL // 2})
    assert resolve(resolver, "alice", None, "img-1", {"max_pixels": SMALL // 2}).grid_thw == small.grid_thw
