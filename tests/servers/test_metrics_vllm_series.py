"""vLLM's request, step and cache series on /metrics: names, types, labels, buckets, and values equal to what ran."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_cases import API_KEY, CKPT, MAX_MODEL_LEN, MEDIA, NUM_BLOCKS, data_url

from mm_infer.engine.outputs.request_stats import (
    ITERATION_TOKENS,
    REQUEST_LATENCY,
    TOKEN_LATENCY,
    RequestStats,
    build_1_2_5_buckets,
)
from servers.openai.launch import BackgroundServer
from servers.openai.web.metrics_collector import VLLM_E2E_BUCKETS, VLLM_TTFT_BUCKETS, Reading, vllm_engine_families

AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL = CKPT.name
PHASES = ("request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
          "request_inference_time_seconds", "request_prompt_tokens", "request_generation_tokens")
BUCKETS = {  # vLLM 0.1x's buckets (vllm/v1/metrics/loggers.py), per histogram
    "vllm:inter_token_latency_seconds": TOKEN_LATENCY, "vllm:request_time_per_output_token_seconds": TOKEN_LATENCY,
    **{f"vllm:{p}": REQUEST_LATENCY for p in PHASES[:4]},
    **{f"vllm:{p}": build_1_2_5_buckets(MAX_MODEL_LEN) for p in PHASES[4:]},
    "vllm:iteration_tokens_total": ITERATION_TOKENS,
    "vllm:time_to_first_token_seconds": VLLM_TTFT_BUCKETS, "vllm:e2e_request_latency_seconds": VLLM_E2E_BUCKETS,
}
COUNTERS = ("vllm:request_success", "vllm:prompt_tokens_cached", "vllm:mm_cache_queries", "vllm:mm_cache_hits")
ADDED = {*COUNTERS, *BUCKETS, "vllm:cache_config_info"} - {"vllm:time_to_first_token_seconds",
                                                           "vllm:e2e_request_latency_seconds"}


def scrape(base_url: str) -> dict[str, Any]:
    reply = httpx.get(f"{base_url}/metrics", headers=AUTH)
    assert reply.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(reply.text) if f.name.startswith("vllm:")}


def sample(families: dict[str, Any], name: str, **labels: str) -> float:
    found = [s.value for f in families.values() for s in f.samples
             if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def grew(before: dict[str, Any], after: dict[str, Any], name: str, **labels: str) -> float:
    return sample(after, name, **labels) - sample(before, name, **labels)


def hist(families: dict[str, Any], name: str, part: str) -> float:
    family = families[name]
    return next(s.value for s in family.samples if s.name == f"{name}_{part}")


def check_shapes(families: dict[str, Any]) -> None:
    """Types, vLLM's labels, exact bucket bounds, cumulative buckets ending at +Inf equal to _count."""
    for name in COUNTERS:
        assert families[name].type == "counter", name
    for name, bounds in BUCKETS.items():
        family = families[name]
        assert family.type == "histogram", name
        buckets = [s for s in family.samples if s.name == f"{name}_bucket"]
        assert [b.labels["le"] for b in buckets] == [str(float(b)) for b in bounds] + ["+Inf"], name
        counts = [b.value for b in buckets]
        assert counts == sorted(counts) and counts[-1] == hist(families, name, "count"), name
    for family in families.values():
        for s in family.samples:
            assert s.labels.get("model_name", MODEL) == MODEL, s
            assert "model_name" in s.labels or family.name == "vllm:cache_config_info", s  # as vLLM writes it
            assert family.name not in ADDED or s.labels["engine"] == "0", s
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
    assert reasons >= {"stop", "length", "abort", "error"}


def run_requests(client: openai.OpenAI) -> dict[str, float]:
    """Four chat requests ending by length (3) and stop (1); what they used, by the server's own answers."""
    made: dict[str, float] = {"length": 0, "stop": 0, "prompt": 0, "generated": 0, "cached": 0}
    ids = []
    for i, extra in enumerate(({"ignore_eos": True}, {"ignore_eos": True}, {"ignore_eos": True}, None)):
        body = extra or {"stop_token_ids": [ids[1]], "ignore_eos": True}
        content = "vllm series " + "word " * 40 + str(i % 3)  # the 4th repeats the 1st; all share leading blocks
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}],
                                               max_tokens=5, temperature=0.0,
                                               extra_body={**body, "return_token_ids": True})
        choice = reply.choices[0]
        ids = ids or choice.model_extra["token_ids"]
        made[choice.finish_reason] += 1
        made["prompt"] += reply.usage.prompt_tokens
        made["generated"] += reply.usage.completion_tokens
        made["cached"] += (reply.usage.prompt_tokens_details.cached_tokens or 0)
    return made


def check_values(before: dict[str, Any], after: dict[str, Any], made: dict[str, float]) -> None:
    """Counts equal the requests made; token sums equal the usage answered; the phases add up."""
    n = made["length"] + made["stop"]
    assert made["stop"] == 1 and made["length"] == 3
    for reason in ("length", "stop"):
        assert grew(before, after, "vllm:request_success_total", finished_reason=reason) == made[reason], reason
    assert grew(before, after, "vllm:request_success_total", finished_reason="error") == 0
    for phase in PHASES:
        assert grew(before, after, f"vllm:{phase}_count") == n, phase
    assert grew(before, after, "vllm:request_prompt_tokens_sum") == made["prompt"]
    assert grew(before, after, "vllm:request_generation_tokens_sum") == made["generated"]
    assert grew(before, after, "vllm:prompt_tokens_cached_total") == made["cached"] > 0  # the repeats hit
    assert grew(before, after, "vllm:inter_token_latency_seconds_count") == made["generated"] - n
    assert grew(before, after, "vllm:request_time_per_output_token_seconds_count") == n  # 0 for one token
    prefill, decode = (grew(before, after, f"vllm:request_{p}_time_seconds_sum") for p in ("prefill", "decode"))
    assert prefill > 0 and decode > 0 and grew(before, after, "vllm:request_queue_time_seconds_sum") >= 0
    assert grew(before, after, "vllm:request_inference_time_seconds_sum") == pytest.approx(prefill + decode)
    assert grew(before, after, "vllm:inter_token_latency_seconds_sum") == pytest.approx(decode)  # they telescope
    steps = grew(before, after, "vllm:iteration_tokens_total_count")
    assert made["generated"] / n <= steps <= made["generated"] + n
    computed = made["prompt"] - made["cached"] + made["generated"] - n  # the last sampled token is never fed back
    assert grew(before, after, "vllm:iteration_tokens_total_sum") == computed


def test_series_after_real_requests_in_thread(server, client):
    before = scrape(server.base_url)
    made = run_requests(client)
    after = scrape(server.base_url)
    check_shapes(after)
    check_values(before, after, made)


def test_mm_cache_counts_media_items(server, client):
    url = data_url(MEDIA / "images" / "photo.png", "image/png")
    before = scrape(server.base_url)
    for _ in range(2):
        client.chat.completions.create(model="m", max_tokens=1, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "mm cache"}]}])
    after = scrape(server.base_url)
    assert grew(before, after, "vllm:mm_cache_queries_total") == 2
    assert grew(before, after, "vllm:mm_cache_hits_total") >= 1


def test_cache_config_info_is_the_engines(server):
    families = scrape(server.base_url)
    family = families["vllm:cache_config_info"]
    assert family.type == "gauge" and len(family.samples) == 1
    info = family.samples[0]
    assert info.value == 1 and info.labels["engine"] == "0"
    assert info.labels["num_gpu_blocks"] == str(NUM_BLOCKS) and info.labels["block_size"] == "16"
    assert info.labels["enable_prefix_caching"] == "True" and float(info.labels["gpu_memory_utilization"]) > 0


@pytest.fixture(scope="module")
def core_server() -> Iterator[BackgroundServer]:
    from servers.openai.config import ServerConfig
    from servers.openai.launch import free_port

    options = {"num_kv_blocks": NUM_BLOCKS, "max_model_len": MAX_MODEL_LEN, "batch_invariant": True}
    config = ServerConfig(model_dir=str(CKPT), port=free_port(), api_key=API_KEY, engine_options=options,
                          engine_core="process", extra_served_names=("m",))
    srv = BackgroundServer(config).start()
    yield srv
    srv.stop()


def settled(base_url: str, done: float) -> dict[str, Any]:
    """A scrape once the core's stats report `done` finished requests (they come between steps and when idle)."""
    deadline = time.monotonic() + 30
    while True:
        families = scrape(base_url)
        total = sum(s.value for s in families["vllm:request_success"].samples if s.name.endswith("_total"))
        if total >= done or time.monotonic() > deadline:
            return families
        time.sleep(0.05)


def test_series_after_real_requests_in_an_engine_core_process(core_server):
    client = openai.OpenAI(base_url=f"{core_server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    client.completions.create(model="m", prompt="warm", max_tokens=1)
    before = settled(core_server.base_url, 1)
    made = run_requests(client)
    after = settled(core_server.base_url, 1 + made["length"] + made["stop"])
    check_shapes(after)
    check_values(before, after, made)


def _replica_stats(requests: int) -> dict[str, float]:
    """A replica engine's stats() after `requests` finished one-token requests (a real RequestStats)."""
    stats = RequestStats(MAX_MODEL_LEN)
    for i in range(requests):
        seq = SimpleNamespace(seq_id=i, num_prompt_tokens=7, num_output_tokens=1, num_cached_tokens=0,
                              finish_reason="length")
        stats.scheduled([SimpleNamespace(seq=seq, num_tokens=7)], 1.0)
        stats.token(seq, 1.5)  # type: ignore[arg-type]
        stats.finished(SimpleNamespace(request_id=str(i), seqs=[seq], metrics=SimpleNamespace(arrival_time=0.5)))
    return {"num_waiting": 0, "num_running": 0, "free_blocks": 8, "num_blocks": 8, "prefix_query_tokens": 0,
            "prefix_hit_tokens": 0, "encoder_cache_hits": 0, "encoder_calls": 0, "preemptions": 0,
            "cache_config|block_size": 16, "cache_config|num_gpu_blocks": 8, **stats.snapshot()}


def test_replica_series_are_summed_and_survive_a_restart(monkeypatch):
    from mm_infer.distributed import supervisor as supervisor_module
    from mm_infer.distributed.pool import ReplicaPool
    from mm_infer.distributed.router import Router
    from mm_infer.distributed.slots import PoolConfig

    class Handle:
        def __init__(self, reading: dict[str, float]) -> None:
            self.ping = SimpleNamespace(remote=lambda: {"alive": True, "stalled_s": 0.0, **reading})

    monkeypatch.setattr(supervisor_module, "ray", SimpleNamespace(get=lambda ref, timeout: ref))
    router = Router(2)
    sup = supervisor_module.Supervisor(PoolConfig(str(CKPT), num_replicas=2), router)
    pool = SimpleNamespace(supervisor=sup, router=router)
    for slot, requests in zip(sup.slots, (2, 3), strict=True):
        slot.state, slot.incarnation, slot.handle = "up", 1, Handle(_replica_stats(requests))
        sup._check(slot)
    restarted = sup.slots[1]  # counts from 0 again: one request since
    restarted.incarnation, restarted.handle = 2, Handle(_replica_stats(1))
    sup._check(restarted)
    families = {f.name: f for f in vllm_engine_families(ReplicaPool.engine_gauges(pool), MODEL)}  # type: ignore
    success = {s.labels["finished_reason"]: s.value for s in families["vllm:request_success"].samples}
    assert success["length"] == 2 + 3 + 1 and success["stop"] == 0
    queue = {s.name: s.value for s in families["vllm:request_queue_time_seconds"].samples if "le" not in s.labels}
    assert queue["vllm:request_queue_time_seconds_count"] == 6 and queue["vllm:request_queue_time_seconds_sum"] == 3.0
    assert families["vllm:cache_config_info"].samples[0].labels["num_gpu_blocks"] == "8"


def test_a_reading_without_engine_series_exports_zero_counters_and_no_histograms():
    families = {f.name: f for f in vllm_engine_families(Reading({}, MODEL).values, MODEL)}
    assert set(families) == {"vllm:request_success", "vllm:prompt_tokens_cached"}
    assert all(s.value == 0 for s in families["vllm:request_success"].samples)


def test_engine_counts_aborts_and_each_sample(llm):
    from mm_infer import SamplingParams

    engine = llm.engine
    before = engine.stats()
    engine.add_request("vllm-series-abort", {"prompt": "never scheduled"}, SamplingParams(max_tokens=2))
    engine.abort("vllm-series-abort")
    engine.step()
    llm.generate([{"prompt": "three samples"}], SamplingParams(n=3, max_tokens=2, ignore_eos=True, temperature=1.0,
                                                               seed=1), use_tqdm=False)
    after = engine.stats()

    def grown(key: str) -> float:
        return after[f"vllm|{key}"] - before[f"vllm|{key}"]

    def observed(name: str) -> float:  # a histogram's count: its buckets' own counts, summed
        return sum(v - before[k] for k, v in after.items() if k.startswith(f"vllm|{name}|le="))

    assert grown("request_success|abort") == 1 and grown("request_success|length") == 3
    assert observed("request_prompt_tokens") == 4  # the aborted request and each sample
    assert observed("request_queue_time_seconds") == 3  # the aborted one never left the queue
    assert grown("request_generation_tokens|sum") == 6 and observed("inter_token_latency_seconds") == 3
