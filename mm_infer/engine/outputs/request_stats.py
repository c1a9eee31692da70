"""RequestStats: vLLM's per-request and per-step series (phase times, token counts, finish reasons), measured here."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mm_infer.engine.scheduling.scheduler import ScheduledChunk
    from mm_infer.engine.scheduling.sequence import Sequence, SequenceGroup

__all__ = ["FINISH_REASONS", "PREFIX", "RequestStats", "build_1_2_5_buckets", "histogram_key"]

# Every key stats() exports starts with PREFIX; each one only grows over an engine's life (replica pools bank and sum
# them). "PREFIX<name>" is a counter, "PREFIX<name>|<label>" a labelled counter, "PREFIX<name>|le=<bound>" one
# histogram bucket's own (not cumulative) count, the last bound "+Inf", and "PREFIX<name>|sum" its sum.
PREFIX = "vllm|"
FINISH_REASONS = ("stop", "length", "abort", "error")  # vLLM's FinishReason, every one exported from the start
REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
TOKEN_LATENCY = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                 40.0, 80.0)
ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's buckets for per-request token counts)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


def histogram_key(name: str, part: str) -> str:
    return f"{PREFIX}{name}|{part}"


class _Histogram:
    """Counts per bucket (the last is +Inf) and the sum of what was observed."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # le is inclusive: value <= bound
        self.sum += value

    def items(self, name: str) -> Iterable[tuple[str, float]]:
        for bound, n in zip((*map(repr, self.bounds), "+Inf"), self.counts, strict=True):
            yield histogram_key(name, f"le={bound}"), float(n)
        yield histogram_key(name, "sum"), self.sum


@dataclass
class _Track:
    """One sample's timestamps (perf_counter): first scheduled, first and last sampled token."""

    scheduled: float
    first: float | None = None
    last: float | None = None


class RequestStats:
    """Observed by the engine as it schedules, samples and releases; read (under a lock) by stats(). A sample is one
    vLLM request: n samples of one request count n times, as vLLM's child requests do."""

    def __init__(self, max_model_len: int) -> None:
        tokens = tuple(float(b) for b in build_1_2_5_buckets(max_model_len))
        self._lock = threading.Lock()
        self._tracks: dict[int, _Track] = {}
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.prompt_tokens_cached = 0
        self.hist = {"inter_token_latency_seconds": _Histogram(TOKEN_LATENCY),
                     "request_time_per_output_token_seconds": _Histogram(TOKEN_LATENCY),
                     "request_queue_time_seconds": _Histogram(REQUEST_LATENCY),
                     "request_prefill_time_seconds": _Histogram(REQUEST_LATENCY),
                     "request_decode_time_seconds": _Histogram(REQUEST_LATENCY),
                     "request_inference_time_seconds": _Histogram(REQUEST_LATENCY),
                     "request_prompt_tokens": _Histogram(tokens),
                     "request_generation_tokens": _Histogram(tokens),
                     "iteration_tokens_total": _Histogram(tuple(map(float, ITERATION_TOKENS)))}

    def scheduled(self, chunks: list[ScheduledChunk], now: float) -> None:
        """A step was scheduled: its tokens are one iteration; a sample scheduled the first time leaves the queue."""
        with self._lock:
            self.hist["iteration_tokens_total"].observe(sum(c.num_tokens for c in chunks))
            for c in chunks:
                self._tracks.setdefault(c.seq.seq_id, _Track(now))

    def token(self, seq: Sequence, now: float) -> None:
        """seq took a sampled token at `now`: its first, or one more (an inter-token latency)."""
        with self._lock:
            track = self._tracks.setdefault(seq.seq_id, _Track(now))
            if track.first is None:
                track.first = now
                self.prompt_tokens_cached += seq.num_cached_tokens  # its prefill is done: what the cache served
            elif track.last is not None:
                self.hist["inter_token_latency_seconds"].observe(now - track.last)
            track.last = now

    def finished(self, group: SequenceGroup) -> None:
        """The group ended (finished, aborted or failed): each sample's phases, token counts and finish reason."""
        with self._lock:
            for seq in group.seqs:
                reason = seq.finish_reason or "abort"
                self.success[reason] = self.success.get(reason, 0) + 1
                self._observe_phases(seq, group.metrics.arrival_time, self._tracks.pop(seq.seq_id, None))

    def _observe_phases(self, seq: Sequence, arrival: float, track: _Track | None) -> None:
        """vLLM's phases: queued = scheduled - arrival, prefill = first - scheduled, decode = last - first,
        inference = last - scheduled; a phase that did not happen (never scheduled, no token) is not observed."""
        h = self.hist
        h["request_prompt_tokens"].observe(seq.num_prompt_tokens)
        h["request_generation_tokens"].observe(seq.num_output_tokens)
        if track is None:
            return
        h["request_queue_time_seconds"].observe(max(track.scheduled - arrival, 0.0))
        if track.first is None or track.last is None:
            return
        decode = track.last - track.first
        h["request_prefill_time_seconds"].observe(track.first - track.scheduled)
        h["request_decode_time_seconds"].observe(decode)
        h["request_inference_time_seconds"].observe(track.last - track.scheduled)
        tokens = seq.num_output_tokens  # vLLM's mean time per output token: 0 for a one-token answer
        h["request_time_per_output_token_seconds"].observe(decode / (tokens - 1) if tokens > 1 else 0.0)

    def snapshot(self) -> dict[str, float]:
        """Every series as flat, only-growing numbers (see PREFIX)."""
        with self._lock:
            out = {f"{PREFIX}request_success|{reason}": float(n) for reason, n in self.success.items()}
            out[f"{PREFIX}prompt_tokens_cached"] = float(self.prompt_tokens_cached)
            for name, hist in self.hist.items():
                out.update(hist.items(name))
            return out
