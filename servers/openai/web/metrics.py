"""Metrics: the server's own counts, and /metrics from a private prometheus_client registry per server."""

from __future__ import annotations

import re
import threading
from collections import defaultdict

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector, generate_latest

from servers.openai.web.metrics_collector import (
    LATENCY_BUCKETS,
    VLLM_E2E_BUCKETS,
    VLLM_TTFT_BUCKETS,
    Counts,
    Histogram,
    Reading,
    ServerCollector,
)

__all__ = ["LATENCY_BUCKETS", "Histogram", "Metrics", "Reading", "exposition"]

# Requests whose latency is a generation's end-to-end latency (a scrape or a tokenize call is not).
GENERATION_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})
_INTEGRAL = re.compile(rb"^([^#\n].*) (-?\d+)\.0$", re.M)


def exposition(registry: CollectorRegistry) -> str:
    """The registry in Prometheus text format 0.0.4. Integral values are written as Go's client writes them ("64",
    where Python's writes "64.0"), as this server always did: readers matching exact lines keep working."""
    return _INTEGRAL.sub(rb"\1 \2", generate_latest(registry)).decode()


class Metrics:
    """Counts the HTTP layer records (requests, tokens, aborts, latencies); `running` and `aborted` are bumped by
    the generations themselves. render() is the scrape: the engine reading is passed in, everything else is read
    by the registry's collectors (ours, and prometheus_client's process, platform and GC collectors)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.aborted = 0
        self.running = 0
        self.e2e = Histogram()
        self.ttft = Histogram()
        self.vllm_e2e = Histogram(VLLM_E2E_BUCKETS)  # the same observations in vLLM's buckets
        self.vllm_ttft = Histogram(VLLM_TTFT_BUCKETS)
        self._scrape_lock = threading.Lock()
        self._reading = Reading({}, "")
        self.registry = CollectorRegistry(auto_describe=False)  # per server: several in one process do not clash
        self.registry.register(ServerCollector(self.counts, lambda: self._reading))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def request_done(self, endpoint: str, status: int, seconds: float | None = None) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1
            if seconds is not None and status == 200 and endpoint in GENERATION_ENDPOINTS:
                self.e2e.observe(seconds)
                self.vllm_e2e.observe(seconds)

    def tokens(self, prompt: int, generated: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt
            self.generation_tokens += generated

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)
            self.vllm_ttft.observe(seconds)

    def counts(self) -> Counts:
        """A consistent copy of the counts."""
        with self._lock:
            return Counts(dict(self.requests), self.prompt_tokens, self.generation_tokens, self.aborted,
                          self.running, self.e2e.copy(), self.ttft.copy(), self.vllm_e2e.copy(), self.vllm_ttft.copy())

    def render(self, reading: Reading) -> str:
        """/metrics: every collector of this server's registry, with `reading` as the engine's state now."""
        with self._scrape_lock:
            self._reading = reading
            try:
                return exposition(self.registry)
            finally:
                self._reading = Reading({}, "")
