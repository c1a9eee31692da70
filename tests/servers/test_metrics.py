"""/metrics on prometheus_client: its parser, types, HELP, vLLM names, process metrics, monotonic replica counters."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from server_cases import API_KEY, CKPT

from servers.openai.web.metrics import Metrics, Reading, exposition

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL = CKPT.name
CHAT = '{endpoint="/v1/chat/completions",status="200"}'
TYPES = {  # family name (counters without _total, as the parser names them) -> type
    "mm_infer_requests": "counter", "mm_infer_prompt_tokens": "counter", "mm_infer_generation_tokens": "counter",
    "mm_infer_requests_aborted": "counter", "mm_infer_requests_running": "gauge",
    "mm_infer_e2e_request_latency_seconds": "histogram", "mm_infer_time_to_first_token_seconds": "histogram",
    "mm_infer_num_requests_waiting": "gauge", "mm_infer_num_sequences_running": "gauge",
    "mm_infer_kv_blocks_free": "gauge", "mm_infer_kv_blocks_total": "gauge", "mm_infer_weight_version": "gauge",
    "mm_infer_paused": "gauge", "mm_infer_prefix_cache_query_tokens": "counter",
    "mm_infer_prefix_cache_hit_tokens": "counter", "mm_infer_encoder_cache_hits": "counter",
    "mm_infer_encoder_calls": "counter", "mm_infer_preemptions": "counter", "mm_infer_media_cache_hits": "counter",
    "mm_infer_media_cache_misses": "counter", "mm_infer_media_uuid_cache_hits": "counter",
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge", "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter",
    "vllm:time_to_first_token_seconds": "histogram", "vllm:e2e_request_latency_seconds": "histogram",
    "process_resident_memory_bytes": "gauge", "process_cpu_seconds": "counter", "python_info": "gauge",
}
HISTOGRAMS = [name for name, kind in TYPES.items() if kind == "histogram"]


def scrape(server: Any) -> dict[str, list[Any]]:
    """name -> the families of that name (a counter and its deprecated old-name gauge share one)."""
    reply = httpx.get(f"{server.base_url}/metrics", headers=AUTH)
    assert reply.status_code == 200
    families: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(reply.text):
        families.setdefault(family.name, []).append(family)
    return families


def samples(families: dict[str, list[Any]], name: str) -> list[Sample]:
    return [s for family in families.get(name, []) for s in family.samples]


def value(families: dict[str, list[Any]], sample: str, default: float | None = None, **labels: str) -> float:
    """The one sample named `sample` with these labels (sample names are unique: a counter's end in _total)."""
    found = [s.value for group in families.values() for f in group for s in f.samples
             if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
    if not found and default is not None:
        return default
    assert len(found) == 1, (sample, labels, found)
    return found[0]


def _reading() -> Reading:
    return Reading({"kv_blocks_free": 3, "kv_blocks_total": 4}, "m")


def test_every_family_parses_with_help_and_its_type(server):
    families = scrape(server)
    for name, kind in TYPES.items():
        assert kind in [f.type for f in families.get(name, [])], (name, kind)
    for name, group in families.items():
        for family in group:
            assert family.documentation.strip(), f"{name} has no HELP"
            assert "no description yet" not in family.documentation, f"{name}: add it to GAUGES or COUNTERS"
            assert family.type in ("counter", "gauge", "histogram"), (name, family.type)
            if family.type == "gauge" and TYPES.get(name) == "counter":
                assert family.documentation.startswith("Deprecated"), name


def test_counters_and_histograms_move_after_a_request(server, client):
    before = scrape(server)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "count me"}], max_tokens=3,
                                   extra_body={"ignore_eos": True})
    after = scrape(server)
    for sample, labels, least in (("mm_infer_requests_total", {"endpoint": "/v1/chat/completions", "status": "200"},
                                   1), ("mm_infer_generation_tokens_total", {}, 3),
                                  ("mm_infer_prompt_tokens_total", {}, 1),
                                  ("vllm:generation_tokens_total", {"model_name": MODEL}, 3),
                                  ("vllm:prompt_tokens_total", {"model_name": MODEL}, 1),
                                  ("mm_infer_e2e_request_latency_seconds_count", {}, 1),
                                  ("vllm:time_to_first_token_seconds_count", {"model_name": MODEL}, 1)):
        grew = value(after, sample, **labels) - value(before, sample, 0.0, **labels)
        assert grew >= least, (sample, grew)


def test_vllm_names_carry_the_model_name(server):
    families = scrape(server)
    for name in [n for n in TYPES if n.startswith("vllm:")]:
        assert samples(families, name) and all(s.labels["model_name"] == MODEL for s in samples(families, name)), name
    usage = value(families, "vllm:kv_cache_usage_perc", model_name=MODEL)
    free, total = value(families, "mm_infer_kv_blocks_free"), value(families, "mm_infer_kv_blocks_total")
    assert 0.0 <= usage <= 1.0 and usage == pytest.approx(1 - free / total)


def test_histograms_have_cumulative_buckets_up_to_inf(server):
    families = scrape(server)
    for name in HISTOGRAMS:
        buckets = [s for s in samples(families, name) if s.name == f"{name}_bucket"]
        assert len(buckets) > 5 and buckets[-1].labels["le"] == "+Inf", name
        counts = [s.value for s in buckets]
        assert counts == sorted(counts), name
        assert counts[-1] == next(s.value for s in samples(families, name) if s.name == f"{name}_count")


def test_process_metrics_are_exported(server):
    families = scrape(server)
    assert value(families, "process_resident_memory_bytes") > 1 << 20
    assert value(families, "process_cpu_seconds_total") > 0
    assert samples(families, "python_info")


def test_each_server_has_a_private_registry():
    first, second = Metrics(), Metrics()  # ProcessCollector twice on one registry would raise DuplicateTimeseries
    first.tokens(5, 7)
    assert "mm_infer_generation_tokens_total 7" in first.render(_reading())
    assert "mm_infer_generation_tokens_total 0" in second.render(_reading())
    assert not any(f.name.startswith(("mm_infer", "vllm:")) for f in REGISTRY.collect())


def test_only_generation_requests_are_end_to_end_latencies():
    metrics = Metrics()
    metrics.request_done("/metrics", 200, 0.5)
    metrics.request_done("/health", 200, 0.5)
    metrics.request_done("/v1/chat/completions", 400, 0.5)
    assert metrics.counts().e2e.cumulative()[-1] == ("+Inf", 0.0)
    metrics.request_done("/v1/chat/completions", 200, 0.5)
    assert metrics.counts().e2e.cumulative()[-1] == ("+Inf", 1.0)


def test_integral_values_are_written_as_go_writes_them():
    registry = CollectorRegistry()

    class Fixed:
        def collect(self) -> Any:
            for name, v in (("a", 64), ("b", 0.5), ("c", 12345678), ("d", -3)):
                yield GaugeMetricFamily(name, f"{name} help", value=v)

    registry.register(Fixed())
    text = exposition(registry)
    assert "\na 64\n" in text and "\nb 0.5\n" in text and "\nc 1.2345678e+07\n" in text and "\nd -3\n" in text
    assert "# HELP a a help" in text


# replica counters: a restarted replica counts from 0 again; the pool's sums must not go down
def test_a_restarted_slot_banks_what_its_last_incarnation_counted():
    from mm_infer.distributed.counters import SlotCounters, fold_reading

    slot = fold_reading(SlotCounters(), 1, {"prefix_hit_tokens": 10, "encoder_calls": 4})
    slot = fold_reading(slot, 2, {"prefix_hit_tokens": 3, "encoder_calls": 0})  # restarted: from 0 again
    assert (slot.totals()["prefix_hit_tokens"], slot.totals()["encoder_calls"]) == (13, 4)
    slot = fold_reading(slot, 1, {"prefix_hit_tokens": 50})  # a late ping of the dead incarnation
    slot = fold_reading(slot, 2, {"encoder_calls": 2})  # a reading without a key keeps its last value
    assert (slot.totals()["prefix_hit_tokens"], slot.totals()["encoder_calls"]) == (13, 6)


def test_pool_counters_never_go_down_over_random_restarts():
    from mm_infer.distributed.counters import COUNTER_KEYS, SlotCounters, fold_reading, pool_counters

    rng = random.Random(0)
    slots, engines, incarnations = [SlotCounters(), SlotCounters()], [{}, {}], [1, 1]
    previous = dict.fromkeys(COUNTER_KEYS, 0.0)
    for _ in range(500):
        i = rng.randrange(2)
        if rng.random() < 0.1:
            incarnations[i], engines[i] = incarnations[i] + 1, {}
        engines[i] = {k: engines[i].get(k, 0) + rng.randrange(3) for k in COUNTER_KEYS}
        slots[i] = fold_reading(slots[i], incarnations[i], engines[i])
        now = pool_counters(slots)
        assert all(now[k] >= previous[k] for k in COUNTER_KEYS), (previous, now)
        previous = now


class _Handle:
    def __init__(self, reading: dict[str, Any]) -> None:
        self.ping = SimpleNamespace(remote=lambda: {"alive": True, "stalled_s": 0.0, **reading})


def test_the_pool_exports_counters_carried_over_a_replica_restart(monkeypatch):
    from mm_infer.distributed import supervisor as supervisor_module
    from mm_infer.distributed.pool import ReplicaPool
    from mm_infer.distributed.router import Router
    from mm_infer.distributed.slots import PoolConfig

    monkeypatch.setattr(supervisor_module, "ray", SimpleNamespace(get=lambda ref, timeout: ref))
    router = Router(2)
    sup = supervisor_module.Supervisor(PoolConfig(str(CKPT), num_replicas=2), router)
    pool = SimpleNamespace(supervisor=sup, router=router)
    stats = {"num_waiting": 0, "num_running": 0, "free_blocks": 8, "num_blocks": 8, "prefix_query_tokens": 40,
             "prefix_hit_tokens": 30, "encoder_cache_hits": 5, "encoder_calls": 6, "preemptions": 2}
    for slot in sup.slots:
        slot.state, slot.incarnation, slot.handle = "up", 1, _Handle(stats)
        sup._check(slot)
    before = ReplicaPool.engine_gauges(pool)  # type: ignore[arg-type]
    restarted = sup.slots[1]
    restarted.incarnation, restarted.restarts, restarted.handle = 2, 1, _Handle({**stats, **dict.fromkeys(
        ("prefix_query_tokens", "prefix_hit_tokens", "encoder_cache_hits", "encoder_calls", "preemptions"), 1)})
    sup._check(restarted)
    after = ReplicaPool.engine_gauges(pool)  # type: ignore[arg-type]
    for key in ("prefix_cache_query_tokens", "prefix_cache_hit_tokens", "encoder_cache_hits", "encoder_calls",
                "preemptions"):
        assert after[key] == before[key] + 1, key
    assert after["kv_blocks_total"] == 16 and after["replica_restarts"] == 1
