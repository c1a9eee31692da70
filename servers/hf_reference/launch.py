"""Run the HF reference: on a thread (tests), as a subprocess on a free loopback port, or in the foreground."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from servers.hf_reference.app import Options, Reference, build_app
from servers.openai.launch import free_port

REPO = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m servers.hf_reference", description=__doc__)
    p.add_argument("model_dir")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--no-token-ids", action="store_true",
                   help="act like a plain OpenAI server: no prompt_token_ids / token_ids / message-level ids")
    p.add_argument("--no-logprobs", action="store_true", help="never return logprobs")
    p.add_argument("--max-videos", type=int, help="refuse prompts with more videos (0: no video at all)")
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def make_server(reference: Reference, host: str, port: int, log_level: str = "warning") -> uvicorn.Server:
    app = build_app(reference)
    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off"))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    options = Options(token_ids=not args.no_token_ids, logprobs=not args.no_logprobs, max_videos=args.max_videos)
    server = make_server(Reference(args.model_dir, options), args.host, args.port, args.log_level)
    print(f"hf-reference: serving {args.model_dir} on http://{args.host}:{args.port}", flush=True)
    server.run()


class ThreadServer:
    """The reference on a daemon thread: `with ThreadServer(model_dir) as srv:` yields once it accepts requests."""

    def __init__(self, model_dir: str, options: Options | None = None) -> None:
        self.port = free_port()
        self.reference = Reference(model_dir, options or Options())
        self.server = make_server(self.reference, "127.0.0.1", self.port)
        self.thread = threading.Thread(target=self.server.run, name="hf-reference", daemon=True)
        self.base_url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the HF reference server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def hf_subprocess(model_dir: str, *flags: str, timeout_s: float = 180.0) -> Iterator[str]:
    """`python -m servers.hf_reference MODEL_DIR --port P` on a free port; yields its URL once /health answers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "servers.hf_reference", model_dir, "--port", str(port),
                             "--log-level", "warning", *flags], env=env, cwd=str(REPO))
    try:
        deadline = time.monotonic() + timeout_s
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the HF reference server did not start (exit code {proc.poll()})")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
