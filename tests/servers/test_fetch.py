"""MediaFetcher against a local HTTP server: allowed when private URLs are enabled, capped, no redirects."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest
from local_http import serve_locally
from server_cases import MEDIA

from mm_infer.media import MediaDecodeError, MediaTooLargeError
from servers.openai.bodies.errors import ApiError
from servers.openai.config import FetchConfig
from servers.openai.media import fetch as media_fetch
from servers.openai.media.request_media import MediaFetcher, is_public_address

PHOTO = (MEDIA / "images" / "photo.png").read_bytes()


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/photo.png")
            self.end_headers()
        elif self.path == "/photo.png":
            self.send_response(200)
            self.send_header("Content-Length", str(len(PHOTO)))
            self.end_headers()
            self.wfile.write(PHOTO)
        elif self.path == "/host":
            body = self.headers["Host"].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/chunked":  # no Content-Length: the cap must hold while streaming
            self.send_response(200)
            self.end_headers()
            self.wfile.write(PHOTO)
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    with serve_locally(Handler) as url:
        yield url


def fetch(config: FetchConfig, url: str, **kw) -> bytes:
    async def go() -> bytes:
        fetcher = MediaFetcher(config, **kw)
        try:
            return await fetcher.fetch(url)
        finally:
            await fetcher.aclose()
    return asyncio.run(go())


def test_local_http_allowed_when_private_urls_are(http_url):
    assert fetch(FetchConfig(allow_private_urls=True), f"{http_url}/photo.png") == PHOTO


def test_private_http_refused_by_default(http_url):
    with pytest.raises(ApiError) as e:
        fetch(FetchConfig(), f"{http_url}/photo.png")
    assert e.value.status == 403


def test_checked_address_is_pinned_with_the_original_host(http_url):
    port = http_url.rsplit(":", 1)[1]
    seen: list[str] = []

    def allow(address: str) -> bool:  # a policy that accepts loopback, so the pinning path runs locally
        seen.append(address)
        return True

    host = fetch(FetchConfig(), f"http://localhost:{port}/host", address_allowed=allow)
    assert host == f"localhost:{port}".encode()
    assert seen and all(a in ("127.0.0.1", "::1") for a in seen)


def test_redirects_and_errors_are_not_followed(http_url):
    cfg = FetchConfig(allow_private_urls=True)
    with pytest.raises(ApiError, match="redirect"):
        fetch(cfg, f"{http_url}/redirect")
    with pytest.raises(ApiError, match="404"):
        fetch(cfg, f"{http_url}/missing")


@pytest.mark.parametrize("path", ["/photo.png", "/chunked"])
def test_byte_cap(http_url, path):
    with pytest.raises(MediaTooLargeError):
        fetch(FetchConfig(allow_private_urls=True, max_bytes=1000), f"{http_url}{path}")


def test_timeout_is_400():
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts the connection, never answers
    try:
        with pytest.raises(ApiError, match="timed out"):
            fetch(FetchConfig(allow_private_urls=True, timeout_s=0.3),
                  f"http://127.0.0.1:{listener.getsockname()[1]}/x")
    finally:
        listener.close()


def test_file_urls_only_under_roots(tmp_path):
    (tmp_path / "ok.bin").write_bytes(b"abc")
    cfg = FetchConfig(allowed_media_paths=(tmp_path,))
    assert fetch(cfg, f"file://{tmp_path}/ok.bin") == b"abc"
    with pytest.raises(ApiError) as e:
        fetch(FetchConfig(), f"file://{tmp_path}/ok.bin")
    assert e.value.status == 403
    with pytest.raises(ApiError, match="remote host"):
        fetch(cfg, f"file://evil.example{tmp_path}/ok.bin")


@pytest.mark.parametrize("address, public", [("127.0.0.1", False), ("10.1.2.3", False), ("169.254.169.254", False),
                                             ("::1", False), ("::ffff:192.168.0.1", False), ("8.8.8.8", True),
                                             ("2606:4700:4700::1111", True)])
def test_public_address_rule(address, public):
    assert is_public_address(address) is public


def test_live_server_fetches_http_media_when_allowed(http_url, photo_url):
    import openai
    from server_cases import CKPT, SMALL

    from servers.openai.config import ServerConfig
    from servers.openai.launch import BackgroundServer, free_port

    config = ServerConfig(model_dir=str(CKPT), port=free_port(), fetch=FetchConfig(allow_private_urls=True),
                          extra_served_names=("m",),  # the requests name "m": an unserved name is a 404
                          engine_options={"num_kv_blocks": 64, "max_model_len": 512})
    with BackgroundServer(config) as srv:
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="none", max_retries=0)
        ids = []
        for url in (f"{http_url}/photo.png", photo_url):
            r = client.chat.completions.create(
                model="m", max_tokens=3, temperature=0.0,
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
                extra_body={"return_token_ids": True, "mm_processor_kwargs": {"max_pixels": SMALL}})
            ids.append((r.model_extra["prompt_token_ids"], r.choices[0].model_extra["token_ids"]))
        assert ids[0] == ids[1]
        with pytest.raises(openai.BadRequestError, match="redirect"):
            client.chat.completions.create(model="m", max_tokens=1, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": f"{http_url}/redirect"}}]}])


def test_symlink_out_of_an_allowed_root_is_refused(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "secret.bin"
    root.mkdir()
    outside.write_bytes(b"secret")
    (root / "link.bin").symlink_to(outside)
    with pytest.raises(ApiError) as e:
        fetch(FetchConfig(allowed_media_paths=(root,)), f"file://{root}/link.bin")
    assert e.value.status == 403


@pytest.mark.parametrize("size, on_loop", [(1000, True), (media_fetch.INLINE_DATA_URL_CHARS, False)])
def test_data_urls_decode_on_the_loop_only_when_small(monkeypatch, size, on_loop):
    threads: list[int] = []
    real = media_fetch.decode_data_url

    def decode(url: str, **kw) -> bytes:
        threads.append(threading.get_ident())
        return real(url, **kw)

    monkeypatch.setattr(media_fetch, "decode_data_url", decode)
    payload = bytes(range(256)) * (size // 256)
    assert fetch(FetchConfig(), "data:image/png;base64," + base64.b64encode(payload).decode()) == payload
    assert (threads == [threading.get_ident()]) == on_loop  # asyncio.run's loop runs on this thread
    with pytest.raises(MediaDecodeError, match="invalid base64"):
        fetch(FetchConfig(), "data:image/png;base64," + "*" * size)
