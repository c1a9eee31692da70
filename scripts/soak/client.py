"""Soak client: sends one Req over httpx, checks the answer is complete, and tallies statuses, 5xx and lost answers."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from scripts.soak.traffic import Req

ABORTED = "the request was aborted"  # message of the 503 a /pause in mode abort gives in-flight requests


def brief(raw: bytes | str, limit: int = 400) -> str:
    """A request or answer body for a report: long strings (data: URLs) cut, the whole thing capped."""
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
    try:
        def cut(v: object) -> object:
            if isinstance(v, str) and len(v) > 60:
                return f"{v[:40]}...({len(v)} chars)"
            if isinstance(v, list) and len(v) > 8:
                return [cut(x) for x in v[:4]] + [f"...({len(v)} items)"]
            if isinstance(v, dict):
                return {k: cut(x) for k, x in v.items()}
            return [cut(x) for x in v] if isinstance(v, list) else v
        text = json.dumps(cut(json.loads(text)))
    except (ValueError, RecursionError):
        pass
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


@dataclass
class Outcome:
    status: str  # "200", "400", ..., "stream-error-503", "lost"
    detail: str = ""
    lost: bool = False
    t0: float = 0.0
    t1: float = 0.0
    nbytes: int = 0  # the answer's body (plain answers only)


@dataclass
class Tally:
    sent: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    hostile_accepted: dict[str, list[str]] = field(default_factory=dict)  # hostile requests answered 200
    lost: dict[str, list[str]] = field(default_factory=dict)  # "kind path -> status detail": request bodies
    fivexx: dict[str, list[str]] = field(default_factory=dict)
    innocent: dict[str, list[str]] = field(default_factory=dict)  # normal requests answered neither 200 nor 5xx
    unexpected: dict[str, list[str]] = field(default_factory=dict)  # requests with `expect` given another status
    watched: dict[str, list[tuple[str, int, float, int, str]]] = field(default_factory=dict)  # expect kinds:
    # status, body bytes, seconds, server tree RSS (KiB) when the answer came, the answer's start
    innocent_s: list[float] = field(default_factory=list)  # seconds of each normal request
    probe: Callable[[], int] | None = None  # the server's RSS now (KiB), read after each watched answer
    start: float = field(default_factory=time.monotonic)
    expected_aborts: int = 0
    abort_window: tuple[float, float] | None = None  # (sent /pause abort, its answer came)

    def expected_abort(self, out: Outcome) -> bool:
        """A 503 aborted on a request in flight while a /pause in mode abort ran is the documented behaviour."""
        w = self.abort_window
        return w is not None and ABORTED in out.detail and out.t0 <= w[1] + 0.5 and out.t1 >= w[0]

    def _bucket(self, req: Req, out: Outcome, code: str) -> dict[str, list[str]] | None:
        """Where a request's outcome is listed (None: it was what it should be)."""
        if out.lost:
            return self.lost
        if code.startswith("5") and self.expected_abort(out):
            self.expected_aborts += 1
            return None
        if req.expect is not None:
            return None if expected(req.expect, code, out.detail) else self.unexpected
        if code.startswith("5"):
            return self.fivexx
        if req.hostile and code == "200":
            return self.hostile_accepted
        if not req.hostile and code != "200" and out.status != "client-disconnect":
            return self.innocent
        return None

    def record(self, req: Req, out: Outcome) -> None:
        self.sent[req.kind] += 1
        self.statuses[out.status] += 1
        code = out.status.rsplit("-", 1)[-1]
        if req.expect is not None:
            rss = self.probe() if self.probe is not None else 0
            self.watched.setdefault(req.kind, []).append((out.status, out.nbytes, out.t1 - out.t0, rss,
                                                          out.detail[:300]))
        elif not req.hostile:
            self.innocent_s.append(out.t1 - out.t0)
        bucket = self._bucket(req, out, code)
        if bucket is None:
            return
        key = f"{req.kind} {req.path} -> {out.status} {out.detail[:300]!r}"
        key = req.kind if bucket is self.hostile_accepted else key
        when = f"at {out.t0 - self.start:.2f}-{out.t1 - self.start:.2f}s"
        bucket.setdefault(key, []).append(f"{when}: {brief(req.body)}")


def expected(expect: dict[str, str], code: str, detail: str) -> bool:
    """The status is one of `expect` and the answer matches that status's regex."""
    return code in expect and re.search(expect[code], detail) is not None


def count(bucket: dict[str, list[str]]) -> int:
    return sum(len(v) for v in bucket.values())


def _check_choices(body: dict[str, object], n: int) -> str:
    """'' if the body has n choices each with a finish_reason, else what is wrong."""
    choices = body.get("choices")
    if not isinstance(choices, list) or len(choices) != n:
        return f"expected {n} choices, got {brief(json.dumps(choices))}"
    missing = [i for i, c in enumerate(choices) if not isinstance(c, dict) or not c.get("finish_reason")]
    return f"choices {missing} have no finish_reason" if missing else ""


async def _plain(client: httpx.AsyncClient, req: Req, out: Outcome) -> Outcome:
    resp = await client.post(req.path, content=req.body, headers={"content-type": "application/json"})
    out.status, out.detail, out.nbytes = str(resp.status_code), resp.text[:2000], len(resp.content)
    if resp.status_code == 200:
        try:
            problem = _check_choices(resp.json(), req.n)
        except ValueError:
            problem = "200 with a body that is not JSON"
        if problem:
            out.status, out.detail, out.lost = "lost", f"{problem}: {resp.text[:300]}", True
    return out


def _stream_event(data: str, finished: set[int], out: Outcome) -> bool:
    """Handle one SSE data payload; True if it was an error event (the stream should end with [DONE] next)."""
    event = json.loads(data)
    if "error" in event:
        out.status, out.detail = f"stream-error-{event['error'].get('code')}", data[:2000]
        return True
    for choice in event.get("choices") or []:
        if choice.get("finish_reason"):
            finished.add(int(choice.get("index", 0)))
    return False


async def _streamed(client: httpx.AsyncClient, req: Req, out: Outcome) -> Outcome:
    headers = {"content-type": "application/json"}
    async with client.stream("POST", req.path, content=req.body, headers=headers) as resp:
        out.status = str(resp.status_code)
        if resp.status_code != 200:
            out.detail = (await resp.aread()).decode("utf-8", "replace")[:2000]
            return out
        events, errored, done = 0, False, False
        finished: set[int] = set()
        async for line in resp.aiter_lines():
            if req.disconnect_after is not None and events >= req.disconnect_after:
                out.status = "client-disconnect"
                return out  # leaving the block closes the connection mid-stream
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            events += 1
            errored = _stream_event(data, finished, out) or errored
        if not done:
            out.status, out.detail, out.lost = "lost", f"stream ended without [DONE] after {events} events", True
        elif not errored and finished != set(range(req.n)):
            out.status, out.lost = "lost", True
            out.detail = f"[DONE] but finish_reason only for choices {sorted(finished)} of {req.n}"
    return out


async def send(client: httpx.AsyncClient, req: Req) -> Outcome:
    """Send req; transport errors and incomplete answers are lost answers (unless the client hung up itself)."""
    out = Outcome("?", t0=time.monotonic())
    try:
        out = await (_streamed(client, req, out) if req.stream else _plain(client, req, out))
    except (httpx.TransportError, ValueError, KeyError, AttributeError) as exc:
        out.status, out.detail, out.lost = "lost", f"{type(exc).__name__}: {exc}", True
    out.t1 = time.monotonic()
    return out
