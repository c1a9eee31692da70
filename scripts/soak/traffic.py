"""Soak traffic: builds normal (image chat, text completion, streams, n>1) and hostile requests as raw bodies."""

from __future__ import annotations

import base64
import io
import json
import random
from collections.abc import Callable, Container
from dataclasses import dataclass, field

from PIL import Image, ImageDraw

MODEL = "tiny-qwen2-vl"
MAX_PIXELS = 12544  # per-request cap: at most 16 patches, keeps CPU prefill cheap
WORDS = ("red", "blue", "square", "circle", "how", "many", "shapes", "what", "colour", "is", "the", "a", "big")


@dataclass
class Req:
    """One HTTP request of the soak: raw bytes so hostile bodies are sent exactly as written."""

    kind: str
    path: str
    body: bytes
    stream: bool = False
    n: int = 1
    hostile: bool = False
    disconnect_after: int | None = None  # stream: close after this many events (0: right after the headers)
    expect: dict[str, str] | None = None  # the statuses it must get, each with a regex its answer must match


def make_image(rng: random.Random) -> str:
    """A real PNG or JPEG of random shapes, as a data: URL."""
    w, h = rng.randint(28, 160), rng.randint(28, 160)
    img = Image.new("RGB", (w, h), tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(img)
    for _ in range(rng.randint(1, 4)):
        x0, y0 = rng.randrange(w), rng.randrange(h)
        box = (x0, y0, min(w - 1, x0 + rng.randint(3, 40)), min(h - 1, y0 + rng.randint(3, 40)))
        colour = tuple(rng.randrange(256) for _ in range(3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    fmt, mime = ("PNG", "image/png") if rng.random() < 0.5 else ("JPEG", "image/jpeg")
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return f"data:{mime};base64,{base64.b64encode(buf.getvalue()).decode()}"


IMAGE_POOL: list[str] = []  # a fixed set (as RL reuses a dataset), so the server's bounded caches fill in warm-up


def make_pool(seed: int, size: int) -> list[str]:
    rng = random.Random(f"{seed}-images")
    IMAGE_POOL[:] = [make_image(rng) for _ in range(size)]
    return IMAGE_POOL


def image_url(rng: random.Random) -> str:
    return rng.choice(IMAGE_POOL) if IMAGE_POOL else make_image(rng)


def sentence(rng: random.Random, k: int = 6) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, k)))


def _sampling(rng: random.Random) -> dict[str, object]:
    out: dict[str, object] = {"model": MODEL, "max_tokens": rng.randint(1, 24),
                              "temperature": rng.choice([0.0, 0.7, 1.0]), "seed": rng.randrange(1 << 31)}
    if rng.random() < 0.3:
        out["logprobs"] = True
    return out


def chat_body(rng: random.Random, images: int = 1, url: str | None = None, **extra: object) -> dict[str, object]:
    parts: list[dict[str, object]] = [{"type": "image_url", "image_url": {"url": url or image_url(rng)}}
                                      for _ in range(images)]
    parts.append({"type": "text", "text": sentence(rng)})
    body = {**_sampling(rng), "messages": [{"role": "user", "content": parts}],
            "mm_processor_kwargs": {"max_pixels": MAX_PIXELS}, **extra}
    return body


def completion_body(rng: random.Random, **extra: object) -> dict[str, object]:
    body = {**_sampling(rng), "prompt": sentence(rng, 12), **extra}
    if body.pop("logprobs", None):
        body["logprobs"] = rng.randint(0, 3)
    return body


def _js(body: dict[str, object]) -> bytes:
    return json.dumps(body).encode()


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def normal(kind: str, rng: random.Random) -> Req:
    """A well-formed request of `kind` (see NORMAL)."""
    n = rng.randint(2, 4)
    if kind == "chat_image":
        return Req(kind, CHAT, _js(chat_body(rng, images=rng.randint(1, 2))))
    if kind == "chat_image_stream":
        return Req(kind, CHAT, _js(chat_body(rng, stream=True)), stream=True)
    if kind == "chat_image_n":
        return Req(kind, CHAT, _js(chat_body(rng, n=n, temperature=1.0)), n=n)
    if kind == "chat_text_stream_n":
        body = {**_sampling(rng), "messages": [{"role": "user", "content": sentence(rng)}], "n": n, "stream": True,
                "stream_options": {"include_usage": True}}
        return Req(kind, CHAT, _js(body), stream=True, n=n)
    if kind == "completion":
        return Req(kind, COMPLETIONS, _js(completion_body(rng)))
    if kind == "completion_stream":
        return Req(kind, COMPLETIONS, _js(completion_body(rng, stream=True, n=n)), stream=True, n=n)
    if kind == "disconnect_stream":
        body = chat_body(rng, stream=True, max_tokens=64, ignore_eos=True) if rng.random() < 0.5 else \
            completion_body(rng, stream=True, max_tokens=64, ignore_eos=True)
        return Req(kind, CHAT if "messages" in body else COMPLETIONS, _js(body), stream=True,
                   disconnect_after=rng.randint(0, 3))
    raise ValueError(kind)


NORMAL = {"chat_image": 4, "chat_image_stream": 3, "chat_image_n": 2, "chat_text_stream_n": 2, "completion": 3,
          "completion_stream": 2, "disconnect_stream": 2}


def _chat_raw(text_json: str, extra: str = "") -> bytes:
    """A chat body with a user text given as raw JSON (escapes kept as written) and raw extra fields."""
    return (f'{{"model": "{MODEL}", "max_tokens": 4, "messages": [{{"role": "user", "content": {text_json}}}]'
            f'{extra}}}').encode()


def _either(rng: random.Random, **extra: object) -> tuple[str, bytes]:
    """A chat (text only) or a text completion body with `extra` fields."""
    if rng.random() < 0.5:
        return COMPLETIONS, _js(completion_body(rng, **extra))
    return CHAT, _js({**_sampling(rng), "messages": [{"role": "user", "content": sentence(rng)}], **extra})


def _non_finite(rng: random.Random) -> bytes:
    """A completion body with 1e999 / NaN / Infinity (JSON that Python parses to non-finite floats) in a float field."""
    name = rng.choice(["temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p", "repetition_penalty"])
    value = rng.choice(["1e999", "-1e999", "NaN", "Infinity", "-Infinity"])
    return f'{{"model": "{MODEL}", "prompt": "hi", "max_tokens": 4, "{name}": {value}}}'.encode()


def _hostile_bodies(rng: random.Random) -> dict[str, Callable[[], tuple[str, bytes]]]:
    bad_b64 = "data:image/png;base64," + rng.choice(["!!!not-base64!!!", "iVBORw0KGgo=", "", "QUJD" * 7 + "="])
    return {
        "malformed_json": lambda: (CHAT, rng.choice([b'{"model": "x", "messages": [', b"not json", b"",
                                                     b'{"messages": [{"role": "user", "content": "hi"}]}}',
                                                     b"\xff\xfe\x00garbage", b"[1, 2, 3]"])),
        "bad_base64_image": lambda: (CHAT, _js(chat_body(rng) | {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": bad_b64}}, {"type": "text", "text": "hi"}]}]})),
        "unknown_model": lambda: _either(rng, model="no-such-model-" + str(rng.randrange(99))),
        "huge_max_tokens": lambda: (COMPLETIONS, _js(completion_body(rng, stream=True, max_tokens=rng.choice(
            [10**6, 2**31, 2**63, 10**30])))),
        "negative_temperature": lambda: (CHAT, _chat_raw('"hi"', f', "temperature": {rng.choice([-1, -0.01, -1e9])}')),
        "bad_logit_bias": lambda: (COMPLETIONS, _js(completion_body(rng, logit_bias=rng.choice(
            [{"999999": 1.0}, {"-1": 1.0}, {"abc": 1.0}, {"5": 1e9}, {"3007": -500}, {"1" * 40: 1.0}])))),
        "too_many_stop": lambda: _either(rng, stop=[sentence(rng) + str(i) for i in range(rng.choice([5, 100, 5000]))]),
        "out_of_range_seed": lambda: (COMPLETIONS, _js(completion_body(rng, seed=rng.choice(
            [2**64, 2**63, -1, -(2**63) - 1, 10**30])))),
        "non_finite": lambda: (COMPLETIONS, _non_finite(rng)),
        "lone_surrogate": lambda: rng.choice([(CHAT, _chat_raw(rng.choice(['"\\ud800"', '"a\\udfffb"',
                                                                           '"\\udc00\\ud800"']))),
                                              (COMPLETIONS, f'{{"model": "{MODEL}", "prompt": "x\\ud83d", '
                                                            f'"max_tokens": 3}}'.encode()),
                                              (COMPLETIONS, f'{{"model": "{MODEL}", "prompt": "hi", '
                                                            f'"stop": ["\\udbff"], "max_tokens": 3}}'.encode())]),
        "bad_mm_processor_kwargs": lambda: (CHAT, _js(chat_body(rng) | {"mm_processor_kwargs": rng.choice(
            [{"max_pixels": -5}, {"max_pixels": "big"}, {"bogus": 1}, {"min_pixels": 10**30}, {"max_pixels": 0},
             {"min_pixels": 10**6, "max_pixels": 100}, {"fps": -1}, {"max_pixels": 1e999}])})),
    }


HOSTILE = ("malformed_json", "bad_base64_image", "unknown_model", "huge_max_tokens", "negative_temperature",
           "bad_logit_bias", "too_many_stop", "out_of_range_seed", "non_finite", "lone_surrogate",
           "bad_mm_processor_kwargs")


def hostile(kind: str, rng: random.Random) -> Req:
    """A hostile request of `kind` (see HOSTILE): expected to get a 4xx (never a 5xx or a dropped connection)."""
    path, body = _hostile_bodies(rng)[kind]()
    if kind == "huge_max_tokens":  # clamped to the context (vLLM's rule): a client that gives up after 8 events
        return Req(kind, path, body, stream=True, hostile=True, disconnect_after=8)
    return Req(kind, path, body, hostile=True)


@dataclass(frozen=True)
class Mix:
    """The hostile side of the traffic: its kinds, how one is built, and the kinds kept to one in flight."""

    kinds: tuple[str, ...] = HOSTILE
    make: Callable[[str, random.Random], Req] = hostile
    heavy: frozenset[str] = field(default_factory=frozenset)


def pick(rng: random.Random, hostile_share: float, mix: Mix | None = None, busy: Container[str] = ()) -> Req:
    """A normal request, or with probability hostile_share a hostile one of a kind not in `busy`."""
    if rng.random() < hostile_share:
        mix = mix or Mix()
        return mix.make(rng.choice([k for k in mix.kinds if k not in busy]), rng)
    kinds, weights = zip(*NORMAL.items(), strict=True)
    return normal(rng.choices(kinds, weights)[0], rng)
