"""Count the repo's source files whose code runs while the in-process server answers one image chat request."""

from __future__ import annotations

import base64
import importlib
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

PACKAGES = ("mm_infer", "servers", "mm_infer_kernels")
OPTIONS: dict[str, Any] = {"num_kv_blocks": 256, "max_model_len": 2048, "cpu_threads": 1, "batch_invariant": True}


def repo_root() -> Path:
    """The nearest folder above this script that holds pyproject.toml (works wherever the script is copied)."""
    return next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


REPO = repo_root()
PREFIXES = tuple(str(REPO / pkg) + "/" for pkg in PACKAGES)
seen: set[str] = set()
recording = False


def hook(frame: FrameType, event: str, arg: Any) -> None:
    """Profile hook on every thread: note the file of each frame that calls, returns or calls into C."""
    if recording:
        name = frame.f_code.co_filename
        if name.startswith(PREFIXES):
            seen.add(name)


def find_class(name: str, guesses: tuple[str, ...]) -> Any:
    """`name` from the first guessed module that has it, else from any module under servers/ defining it."""
    candidates = list(guesses) + [".".join(p.relative_to(REPO).with_suffix("").parts)
                                  for p in sorted((REPO / "servers").rglob("*.py"))
                                  if f"class {name}" in p.read_text()]
    for module in candidates:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"no module defines {name}")


def chat_body(stream: bool) -> dict[str, Any]:
    png = (REPO / "assets/media/shapes/colour_example.png").read_bytes()
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return {"model": "tiny", "max_tokens": 8, "temperature": 0.0, "stream": stream,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                      {"type": "text", "text": "What colour?"}]}]}


def ask(http: httpx.Client, stream: bool) -> None:
    if stream:
        with http.stream("POST", "/v1/chat/completions", json=chat_body(True)) as reply:
            assert reply.status_code == 200, reply.read()
            assert any(line == "data: [DONE]" for line in reply.iter_lines())
    else:
        reply = http.post("/v1/chat/completions", json=chat_body(False))
        assert reply.status_code == 200, reply.text


def record(http: httpx.Client, stream: bool, settle_s: float = 0.3) -> list[str]:
    """Files run from sending the request until `settle_s` after its last byte (the engine's tail work)."""
    global recording
    seen.clear()
    recording = True
    ask(http, stream)
    time.sleep(settle_s)
    recording = False
    return sorted(str(Path(f).relative_to(REPO)) for f in seen)


def main() -> None:
    sys.path.insert(0, str(REPO))
    config_cls = find_class("ServerConfig", ("servers.openai.config",))
    server_cls = find_class("BackgroundServer", ("servers.openai.launch",))
    # Python 3.11 cannot set a profile function on a thread that already runs (no setprofile_all_threads),
    # so the hook goes on before the server starts and stays off until a measured request.
    threading.setprofile(hook)
    sys.setprofile(hook)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    config = config_cls(model_dir=str(REPO / "assets/models/tiny-qwen2-vl"), served_model_name="tiny",
                        port=port, engine_options=dict(OPTIONS))
    server = server_cls(config).start()
    try:
        with httpx.Client(base_url=server.base_url, timeout=120) as http:
            ask(http, stream=False)  # warm-up: lazy imports, compiled paths, caches
            plain = record(http, stream=False)
            streamed = record(http, stream=True)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        server.stop()
    print(f"repo: {REPO}")
    for kind, files in (("chat", plain), ("streamed chat", streamed)):
        print(f"{kind}: {len(files)} files")
        for f in files:
            print(f"  {f}")
    print(f"modules per chat request: {len(plain)} (streamed: {len(streamed)})")


if __name__ == "__main__":
    main()
