"""Prometheus text exposition written by hand: counters, gauges and latency histograms."""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from collections.abc import Mapping

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += n
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'{name}_bucket{{le="{le}"}} {running}')
        return out + [f"{name}_sum {self.sum}", f"{name}_count {self.count}"]


class Metrics:
    """Server-side counters; engine and cache gauges are read at scrape time and passed to render()."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.aborted = 0
        self.running = 0
        self.e2e = Histogram()
        self.ttft = Histogram()

    def request_done(self, endpoint: str, status: int, seconds: float | None = None) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1
            if seconds is not None and status == 200:
                self.e2e.observe(seconds)

    def tokens(self, prompt: int, generated: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt
            self.generation_tokens += generated

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def render(self, gauges: Mapping[str, float]) -> str:
        p = "mm_infer"
        with self._lock:
            lines = [f"# HELP {p}_requests_total HTTP requests by endpoint and status.",
                     f"# TYPE {p}_requests_total counter"]
            lines += [f'{p}_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                      for (e, s), n in sorted(self.requests.items())]
            for name, value, kind in (("prompt_tokens_total", self.prompt_tokens, "counter"),
                                      ("generation_tokens_total", self.generation_tokens, "counter"),
                                      ("requests_aborted_total", self.aborted, "counter"),
                                      ("requests_running", self.running, "gauge")):
                lines += [f"# TYPE {p}_{name} {kind}", f"{p}_{name} {value}"]
            for name, hist in (("e2e_request_latency_seconds", self.e2e),
                               ("time_to_first_token_seconds", self.ttft)):
                lines += [f"# TYPE {p}_{name} histogram", *hist.lines(f"{p}_{name}")]
        for name, value in sorted(gauges.items()):
            lines += [f"# TYPE {p}_{name} gauge", f"{p}_{name} {value}"]
        return "\n".join(lines) + "\n"
