"""SSRF rules for http(s) media: IPv6 ranges that embed or hide private IPv4, odd IPv4 spellings, malformed URLs."""

from __future__ import annotations

import asyncio

import pytest

from servers.openai.bodies.errors import ApiError
from servers.openai.config import FetchConfig
from servers.openai.media.addresses import check_host_form
from servers.openai.media.request_media import MediaFetcher, is_public_address


@pytest.mark.parametrize("address", [
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::808:808",  # NAT64 of 8.8.8.8: refused too (embedding ranges are refused, not judged)
    "64:ff9b:1::a00:1",  # NAT64 local-use
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "2002:808:808::1",  # 6to4 of 8.8.8.8
    "::127.0.0.1",  # IPv4-compatible
    "::8.8.8.8",
    "::ffff:0:127.0.0.1",  # IPv4-translated
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
    "fec0::1",  # site-local
    "feff:ffff::1",
])
def test_embedding_and_site_local_ranges_are_refused(address: str) -> None:
    """F8: these all passed `is_global`."""
    assert is_public_address(address) is False


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "2606:4700:4700::1111",
                                     "2001:4860:4860::8888", "::ffff:8.8.8.8", "2a00:1450:4001::200e"])
def test_public_addresses_still_allowed(address: str) -> None:
    assert is_public_address(address) is True


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "::", "::ffff:127.0.0.1", "fe80::1%eth0", "fc00::1",
                                     "100.64.0.1", "224.0.0.1", "ff02::1"])
def test_private_addresses_still_refused(address: str) -> None:
    assert is_public_address(address) is False


def fetch_error(config: FetchConfig, url: str) -> ApiError:
    async def go() -> None:
        fetcher = MediaFetcher(config)
        try:
            await fetcher.fetch(url)
        finally:
            await fetcher.aclose()
    with pytest.raises(ApiError) as e:
        asyncio.run(go())
    return e.value


NUMERIC_HOSTS = ["0177.0.0.1", "2130706433", "0x7f.1", "127.1", "0x7f000001", "127.0.0.1.", "0177.1", "017700000001",
                 "127.000.000.001", "1.2.3.4.5", "0x"]


@pytest.mark.parametrize("private", [True, False])
@pytest.mark.parametrize("host", NUMERIC_HOSTS)
def test_non_decimal_ipv4_hosts_are_400(host: str, private: bool) -> None:
    """F12: with private URLs allowed, `http://0177.0.0.1` was a 500 (httpx.InvalidURL escaped)."""
    error = fetch_error(FetchConfig(allow_private_urls=private, timeout_s=2.0), f"http://{host}:9/x.png")
    assert error.status == 400 and error.param == "url"
    assert "dotted-quad" in error.message


@pytest.mark.parametrize("url, words", [
    ("http://example.com:99999/x.png", "Port out of range"),  # was a ValueError, so a 500
    ("http://example.com:abc/x.png", "Port could not be cast"),
    ("http://[::1/x.png", "Invalid IPv6 URL"),
    ("http:///x.png", "no host"),
])
def test_malformed_http_urls_are_400(url: str, words: str) -> None:
    error = fetch_error(FetchConfig(allow_private_urls=True), url)
    assert error.status == 400 and words in error.message


@pytest.mark.parametrize("host", ["1.2.3.4.nip.io", "0x7f.example", "127.0.0.1", "8.8.8.8", "::1", "example.com."])
def test_names_and_plain_addresses_pass_the_form_check(host: str) -> None:
    """Only a host whose last label is a number is an IPv4 spelling; a name is judged by its resolved address."""
    check_host_form(host)
