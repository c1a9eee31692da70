"""The hostile soak's turn-3 kinds: poisoned inline features, template bombs, huge schemas, long prompts, huge n."""

from __future__ import annotations

import base64
import json
import random
import struct
import time
from collections.abc import Callable

import httpx

from scripts.soak.client import Outcome, Tally
from scripts.soak.traffic import CHAT, COMPLETIONS, HOSTILE, IMAGE_POOL, MODEL, Mix, Req, chat_body, hostile

# huge n: n=64 x 1500 tokens x 21 logprobs is over --max-logprob-entries (1M): a 400 naming the cap
HUGE_N_EXPECT: dict[str, str] = {"400": "logprob entries"}
MAX_MODEL_LEN = 32768  # the hostile server's --max-model-len (the checkpoint's max_position_embeddings)
NUM_KV_BLOCKS = 8192  # room for one huge-n request (64 x 1501 tokens) beside a long prompt and the normal mix
# the grammar cache (256M by default) would fill over the whole run with schema_large's distinct grammars (~2-3 MB
# each): at 8M it fills during warm-up, so the RSS check sees growth that no configured bound explains
SERVER_FLAGS = ("--trust-request-chat-template", "--grammar-cache-bytes", "8M")
LONG_PROMPT_TOKENS = 16000  # prefill: 0.5-1 min on 2 busy CPU cores; --long-prompt-tokens changes it
GENERATE, CHAT_RENDER = "/inference/v1/generate", "/v1/chat/completions/render"
ROW_WIDTH = 3 * 2 * 14 * 14  # this checkpoint's patch rows: channels x temporal_patch_size x patch_size^2
LOOP_BOMB = ("{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}"
             "{{ '' }}{% endfor %}{% endfor %}{% endfor %}")
SIZE_BOMBS = ("{{ 'a' * 100000000 }}", "{{ ['a'] * 100000000 }}", "{% set s = 'ab' * 1000 %}{{ s * 1000000 }}",
              "{{ 7 ** 100000000 }}")
RENDERS: list[dict[str, object]] = []  # render answers with inline features, the poisoned kind's raw material


def _row_payload(head: dict, value: float, rng: random.Random) -> bytes:
    """An inline item in the rows form: the header's grid, every pixel row value `value` (NaN, inf, 3e38)."""
    t, h, w = head["grid_thw"]
    row = struct.pack("<f", value) * ROW_WIDTH  # 3e38 is a finite float32, out of every channel's range
    new = {k: head.get(k) for k in ("modality", "grid_thw", "second_per_grid_t", "timestamps", "frame_indices")}
    new |= {"content_hash": rng.randbytes(32).hex(), "dtype": "float32", "shape": [t * h * w, ROW_WIDTH]}
    return json.dumps(new).encode() + b"\n" + row * (t * h * w)


def poisoned(rng: random.Random) -> bytes:
    """A render answer sent back to /generate with its item replaced by NaN / inf / 3e38 rows (or a frames payload
    with a NaN std) under a fresh hash, so the server must decode and check it."""
    answer = rng.choice(RENDERS)
    features = dict(answer["features"])  # type: ignore[arg-type]
    head_raw, frames = base64.b64decode(features["kwargs_data"]["image"][0]).split(b"\n", 1)
    head = json.loads(head_raw)
    variant = rng.choice(["nan", "inf", "-inf", "3e38", "-3e38", "std-nan"])
    if variant == "std-nan" and isinstance(head.get("spec"), dict):  # a frames payload (images render so)
        head["spec"] = {**head["spec"], "image_std": [float("nan")] * 3}
        payload = json.dumps(head).encode() + b"\n" + frames
    else:
        payload = _row_payload(head, float(variant.removeprefix("std-")), rng)
    features["mm_hashes"] = {"image": [rng.randbytes(32).hex()]}
    features["kwargs_data"] = {"image": [base64.b64encode(payload).decode()]}
    return json.dumps({**answer, "request_id": None, "features": features}).encode()


def _schema(props: int, pad: int = 0) -> dict[str, object]:
    names = [f"field_{i}_" + "x" * pad for i in range(props)]
    schema = {"type": "object", "properties": {n: {"type": "string", "maxLength": 8} for n in names},
              "required": names[:5]}
    return {"type": "json_schema", "json_schema": {"name": "soak", "schema": schema}}


OVER_CAP_SCHEMA = _schema(9000, 20)  # ~590 KB of JSON, over the 256K --max-grammar-bytes default


def _chat(rng: random.Random, **extra: object) -> bytes:
    words = rng.choice(["hi", "tell me a story", "what is two and two"])
    return json.dumps({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": words}],
                       **extra}).encode()


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 2900) for _ in range(n)]  # text ids below the checkpoint's specials (3000+)


def _huge_n(rng: random.Random) -> tuple[str, bytes]:
    common = {"model": MODEL, "n": 64, "max_tokens": 1500, "ignore_eos": True, "temperature": 1.0}
    if rng.random() < 0.5:
        return COMPLETIONS, json.dumps({**common, "prompt": "once upon a time", "logprobs": 20}).encode()
    return CHAT, _chat(rng, **common, logprobs=True, top_logprobs=20)


LENGTH = r"(?i)length|tokens"


def builders(long_tokens: int) -> dict[str, tuple[dict[str, str], Callable[[random.Random], tuple[str, bytes]]]]:
    """Each turn-3 kind: the statuses it must get (a regex its answer must match) and how its body is built."""
    return {
        "poisoned_features": ({"400": "inline item"}, lambda r: (GENERATE, poisoned(r))),
        "template_size_bomb": ({"400": "chat_template", "503": "retry later"}, lambda r: (CHAT, _chat(
            r, chat_template=r.choice(SIZE_BOMBS)))),
        "template_loop_bomb": ({"400": "chat_template", "503": "retry later"}, lambda r: (CHAT, _chat(
            r, chat_template=LOOP_BOMB))),
        "schema_over_cap": ({"400": "max_grammar_bytes|bytes"}, lambda r: (CHAT, _chat(
            r, response_format=OVER_CAP_SCHEMA))),
        "schema_large": ({"200": "", "400": ""}, lambda r: (CHAT, _chat(
            r, response_format=_schema(r.randint(200, 400)), max_tokens=16))),
        "long_prompt": ({"200": "", "400": LENGTH}, lambda r: (COMPLETIONS, json.dumps(
            {"model": MODEL, "prompt": _ids(r, long_tokens), "max_tokens": 2}).encode())),
        "prompt_over_len": ({"400": LENGTH}, lambda r: (COMPLETIONS, json.dumps(
            {"model": MODEL, "prompt": _ids(r, MAX_MODEL_LEN + r.randint(1, 8000)), "max_tokens": 2}).encode())),
        "huge_n": (HUGE_N_EXPECT, _huge_n),
    }


HEAVY = frozenset({"long_prompt", "huge_n"})  # at most one of each in flight: each holds the CPU for a minute


def hostile_mix(long_tokens: int = LONG_PROMPT_TOKENS) -> Mix:
    """The soak's hostile kinds plus the turn-3 kinds, each turn-3 request carrying the statuses it must get."""
    table = builders(long_tokens)

    def make(kind: str, rng: random.Random) -> Req:
        if kind not in table:
            return hostile(kind, rng)
        expect, build = table[kind]
        path, body = build(rng)
        n = json.loads(body).get("n", 1) if kind == "huge_n" else 1
        return Req(kind, path, body, n=n, hostile=True, expect=expect)
    return Mix(HOSTILE + tuple(table), make, HEAVY)


async def prime_renders(client: httpx.AsyncClient, tally: Tally, seed: int, count: int = 8) -> None:
    """Render `count` pool images with inline features (innocent requests: each must be a 200 with features);
    the pool must be made first."""
    rng = random.Random(f"{seed}-render")
    for url in IMAGE_POOL[:count]:
        req = Req("render_tensors", CHAT_RENDER, json.dumps(chat_body(rng, url=url, mm_payload="tensors")).encode())
        out = Outcome("?", t0=time.monotonic())
        try:
            resp = await client.post(req.path, content=req.body, headers={"content-type": "application/json"})
            out.status, out.detail, out.nbytes = str(resp.status_code), resp.text[:2000], len(resp.content)
            answer = resp.json() if resp.status_code == 200 else None
            if answer is not None and not (answer.get("features") or {}).get("kwargs_data"):
                out.status, out.detail, out.lost = "lost", f"render without inline features: {resp.text[:300]}", True
            elif answer is not None:
                RENDERS.append(answer)
        except (httpx.TransportError, ValueError) as exc:
            out.status, out.detail, out.lost = "lost", f"{type(exc).__name__}: {exc}", True
        out.t1 = time.monotonic()
        tally.record(req, out)
    if not RENDERS:
        raise SystemExit("soak: FAIL (no render answered with inline features: the poisoned kind has nothing to send)")
