"""ServerCollector: every /metrics series (mm_infer_* and vLLM's names), built from one snapshot at scrape time."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from mm_infer.engine.outputs.request_stats import FINISH_REASONS, PREFIX

P = "mm_infer_"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# vLLM's buckets for the two latencies the HTTP layer measures (vllm/v1/metrics/loggers.py)
VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                     20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                    480.0, 960.0, 1920.0, 7680.0)

# Scrape-time readings (ServerState.gauges(): engine or pool, media caches, pause gate), by how they move.
GAUGES: dict[str, str] = {
    "num_requests_waiting": "Requests queued in the engine scheduler, not yet running (summed over replicas).",
    "num_sequences_running": "Sequences in the engine's running batch (summed over replicas).",
    "kv_blocks_free": "Free KV-cache blocks (summed over replicas).",
    "kv_blocks_total": "KV-cache blocks in the pool (summed over replicas).",
    "weight_version": "Weight version answers carry; every refit moves it.",
    "paused": "1 while the server is paused (POST /pause), else 0.",
    "replicas": "Engine replicas configured (--replicas).",
    "replicas_up": "Engine replicas up and taking requests.",
    "router_affinity_hit_rate": "Share of requests with an already pinned affinity key sent to that replica.",
}
COUNTERS: dict[str, str] = {
    "prefix_cache_query_tokens": "Prompt tokens looked up in the prefix cache.",
    "prefix_cache_hit_tokens": "Prompt tokens whose KV came from the prefix cache.",
    "encoder_cache_hits": "Media items whose vision embeddings came from the encoder cache.",
    "encoder_calls": "Vision-encoder forward calls.",
    "preemptions": "Sequences preempted (KV freed, recomputed later) for lack of KV blocks.",
    "media_cache_hits": "Media items taken from the server's decoded-media cache.",
    "media_cache_misses": "Media items decoded and preprocessed (not in the decoded-media cache).",
    "media_uuid_cache_hits": "Media parts resolved by their uuid from an earlier request.",
    "replica_restarts": "Engine replicas restarted after a failure.",
    "engine_core_restarts": "Engine core processes restarted after a failure (--engine-core process).",
    "router_spills": "Requests sent away from their pinned replica because it held too many sequences.",
}
# vLLM's names for the same readings (labelled model_name), for dashboards and RL loggers written against vLLM.
VLLM_GAUGES = {"vllm:num_requests_running": ("num_sequences_running", "Requests in the engine's running batch."),
               "vllm:num_requests_waiting": ("num_requests_waiting", "Requests waiting to be scheduled.")}
VLLM_COUNTERS = {"vllm:num_preemptions": ("preemptions", "Preemptions by the engine."),
                 "vllm:prefix_cache_queries": ("prefix_cache_query_tokens", "Prefix-cache queries, in tokens."),
                 "vllm:prefix_cache_hits": ("prefix_cache_hit_tokens", "Prefix-cache hits, in tokens.")}
# vLLM's series the engine measures (RequestStats), by their name after "vllm:", with vLLM's HELP
VLLM_ENGINE_HISTOGRAMS = {
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per request.",
    "request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
    "request_inference_time_seconds": "Histogram of time spent in RUNNING phase for request.",
    "request_prompt_tokens": "Number of prefill tokens processed.",
    "request_generation_tokens": "Number of generation tokens processed.",
    "iteration_tokens_total": "Histogram of number of tokens per engine_step.",
}
ENGINE = "0"  # vLLM's engine label: one engine here (a replica pool's series are summed into it)
# cache_config_info labels, from the engine's "cache_config|<field>" readings, written as vLLM writes them (str())
CACHE_INFO: dict[str, Callable[[float], str]] = {
    "block_size": lambda v: str(int(v)), "enable_prefix_caching": lambda v: str(bool(v)),
    "gpu_memory_utilization": str, "num_gpu_blocks": lambda v: str(int(v))}


class Histogram:
    """Observations counted per upper bound (the last bucket is +Inf), with their sum."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    def copy(self) -> Histogram:
        out = Histogram(self.buckets)
        out.counts, out.sum = list(self.counts), self.sum
        return out

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, observations <= le) per bucket, as HistogramMetricFamily takes them."""
        out, running = [], 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += n
            out.append((floatToGoString(bound), float(running)))
        return out


@dataclass(frozen=True)
class Reading:
    """What the server reads at scrape time: engine, replica, cache and pause values, and the served model."""

    values: Mapping[str, float]
    model_name: str


@dataclass
class Counts:
    """The server's own counts (a snapshot of Metrics, taken under its lock)."""

    requests: dict[tuple[str, int], int] = field(default_factory=dict)  # (endpoint, status) -> answered
    prompt_tokens: int = 0
    generation_tokens: int = 0
    aborted: int = 0
    running: int = 0
    e2e: Histogram = field(default_factory=Histogram)
    ttft: Histogram = field(default_factory=Histogram)
    vllm_e2e: Histogram = field(default_factory=lambda: Histogram(VLLM_E2E_BUCKETS))
    vllm_ttft: Histogram = field(default_factory=lambda: Histogram(VLLM_TTFT_BUCKETS))


def _labels(model: str, engine: bool) -> tuple[list[str], list[str]]:
    """vLLM's label names and values: model_name, and engine where asked (the series added with vLLM's labels)."""
    return (["model_name", "engine"], [model, ENGINE]) if engine else (["model_name"], [model])


def _scalar(kind: type[GaugeMetricFamily] | type[CounterMetricFamily], name: str, doc: str, value: float,
            model: str | None, engine: bool) -> GaugeMetricFamily | CounterMetricFamily:
    """One gauge or counter value, with vLLM's labels when a model is given."""
    if model is None:
        return kind(name, doc, value=value)
    names, values = _labels(model, engine)
    family = kind(name, doc, labels=names)
    family.add_metric(values, value)
    return family


def _gauge(name: str, doc: str, value: float, model: str | None = None, engine: bool = False) -> GaugeMetricFamily:
    return _scalar(GaugeMetricFamily, name, doc, value, model, engine)  # type: ignore[return-value]


def _counter(name: str, doc: str, value: float, model: str | None = None, engine: bool = False) -> CounterMetricFamily:
    return _scalar(CounterMetricFamily, name, doc, value, model, engine)  # type: ignore[return-value]


def _histogram(name: str, doc: str, hist: Histogram, model: str | None = None,
               engine: bool = False) -> HistogramMetricFamily:
    if model is None:
        return HistogramMetricFamily(name, doc, buckets=hist.cumulative(), sum_value=hist.sum)
    names, values = _labels(model, engine)
    family = HistogramMetricFamily(name, doc, labels=names)
    family.add_metric(values, hist.cumulative(), hist.sum)
    return family


def server_families(c: Counts) -> Iterator[Metric]:
    """The HTTP layer's counters, in-flight gauge and latency histograms (mm_infer_* names)."""
    requests = CounterMetricFamily(f"{P}requests", "HTTP requests answered, by endpoint and status.",
                                   labels=["endpoint", "status"])
    for (endpoint, status), n in sorted(c.requests.items()):
        requests.add_metric([endpoint, str(status)], n)
    yield requests
    yield _counter(f"{P}prompt_tokens", "Prompt tokens of finished generations.", c.prompt_tokens)
    yield _counter(f"{P}generation_tokens", "Tokens generated by finished generations.", c.generation_tokens)
    yield _counter(f"{P}requests_aborted", "Generations aborted (client gone, pause, shutdown).", c.aborted)
    yield _gauge(f"{P}requests_running", "Generations in flight in the HTTP layer.", c.running)
    yield _histogram(f"{P}e2e_request_latency_seconds", "Generation requests answered 200: seconds from arrival "
                     "to the last byte.", c.e2e)
    yield _histogram(f"{P}time_to_first_token_seconds", "Seconds from arrival to the first generated token.", c.ttft)


def reading_families(values: Mapping[str, float]) -> Iterator[Metric]:
    """Each scrape-time value: a gauge or a counter (named ..._total); every counter also keeps its name from
    before counters were typed, as a deprecated gauge, so readers of the old names keep working."""
    for key, value in sorted(values.items()):
        if "|" in key:  # vLLM's engine series and the cache config: vllm_engine_families
            continue
        name = P + key
        if key in COUNTERS:
            yield _counter(name, COUNTERS[key], value)
            yield _gauge(name, f"Deprecated: the counter {name}_total under its old name.", value)
        else:
            yield _gauge(name, GAUGES.get(key, f"The engine's {key.replace('_', ' ')} (no description yet)."), value)


def vllm_families(c: Counts, values: Mapping[str, float], model: str) -> Iterator[Metric]:
    """vLLM's names for the series its dashboards and RL loggers read, labelled model_name and engine."""
    for name, (key, doc) in VLLM_GAUGES.items():
        yield _gauge(name, doc, values.get(key, 0.0), model, engine=True)
    free, total = values.get("kv_blocks_free", 0.0), values.get("kv_blocks_total", 0.0)
    yield _gauge("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means every block is in use.",
                 1.0 - free / total if total else 0.0, model, engine=True)
    yield _counter("vllm:prompt_tokens", "Prefill tokens processed.", c.prompt_tokens, model, engine=True)
    yield _counter("vllm:generation_tokens", "Generation tokens processed.", c.generation_tokens, model, engine=True)
    for name, (key, doc) in VLLM_COUNTERS.items():
        yield _counter(name, doc, values.get(key, 0.0), model, engine=True)
    hits, misses = values.get("media_cache_hits", 0.0), values.get("media_cache_misses", 0.0)
    yield _counter("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.",
                   hits + misses, model, engine=True)
    yield _counter("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.", hits, model,
                   engine=True)
    yield _histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                     c.vllm_ttft, model, engine=True)
    yield _histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                     c.vllm_e2e, model, engine=True)


def _engine_histogram(name: str, values: Mapping[str, float]) -> Histogram | None:
    """The engine's flat buckets of one series ("vllm|<name>|le=<bound>", "...|sum") as a Histogram, if read."""
    head = f"{PREFIX}{name}|le="
    bounds = sorted((float(k[len(head):]), v) for k, v in values.items() if k.startswith(head))
    if not bounds or bounds[-1][0] != float("inf"):
        return None
    hist = Histogram(tuple(b for b, _ in bounds[:-1]))
    hist.counts, hist.sum = [int(v) for _, v in bounds], values.get(f"{PREFIX}{name}|sum", 0.0)
    return hist


def vllm_engine_families(values: Mapping[str, float], model: str) -> Iterator[Metric]:
    """The series vLLM's engine core records (finish reasons, phases, token counts, steps) and cache_config_info;
    a histogram the backend has not reported yet (an engine core before its first stats) is left out."""
    success = CounterMetricFamily("vllm:request_success", "Count of successfully processed requests.",
                                  labels=["model_name", "engine", "finished_reason"])
    reasons = dict.fromkeys(FINISH_REASONS, 0.0)
    head = f"{PREFIX}request_success|"
    reasons.update({k[len(head):]: v for k, v in values.items() if k.startswith(head)})
    for reason, n in reasons.items():
        success.add_metric([model, ENGINE, reason], n)
    yield success
    yield _counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).",
                   values.get(f"{PREFIX}prompt_tokens_cached", 0.0), model, engine=True)
    for name, doc in VLLM_ENGINE_HISTOGRAMS.items():
        if (hist := _engine_histogram(name, values)) is not None:
            yield _histogram(f"vllm:{name}", doc, hist, model, engine=True)
    info = {k: fmt(values[f"cache_config|{k}"]) for k, fmt in CACHE_INFO.items() if f"cache_config|{k}" in values}
    if info:
        family = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                   labels=[*info, "engine"])
        family.add_metric([*info.values(), ENGINE], 1.0)
        yield family


class ServerCollector(Collector):
    """A custom collector: reads the server's counts and the engine readings only when scraped."""

    def __init__(self, counts: Callable[[], Counts], reading: Callable[[], Reading]) -> None:
        self.counts = counts
        self.reading = reading

    def collect(self) -> Iterator[Metric]:
        counts, reading = self.counts(), self.reading()
        yield from server_families(counts)
        yield from reading_families(reading.values)
        yield from vllm_families(counts, reading.values, reading.model_name)
        yield from vllm_engine_families(reading.values, reading.model_name)
