"""Through 2 Ray replicas: vLLM's engine series on /metrics are the replicas' own measurements, summed."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from servers.openai.launch import BackgroundServer

REQUESTS, TOKENS = 4, 3


@pytest.fixture(scope="module")
def served(two_replica_server: BackgroundServer) -> BackgroundServer:
    return two_replica_server


def samples(srv: BackgroundServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{srv.base_url}/metrics", timeout=30).text
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return found[(name, tuple(sorted({"engine": "0", **labels}.items())))]


def settled(srv: BackgroundServer, done: int) -> dict[Any, float]:
    """A scrape once the health checks carried `done` finished requests over from the replicas."""
    deadline = time.monotonic() + 60
    while True:
        found = samples(srv)
        if value(found, "vllm:request_success_total", finished_reason="length") >= done or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_replica_series_are_summed_over_the_pool(served):
    body = {"prompt": "replica series", "max_tokens": TOKENS, "ignore_eos": True, "temperature": 0}
    for i in range(REQUESTS):
        reply = httpx.post(f"{served.base_url}/v1/completions", json={**body, "prompt": f"replica series {i}"},
                           timeout=120)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == TOKENS
    found = settled(served, REQUESTS)
    assert value(found, "vllm:request_success_total", finished_reason="length") == REQUESTS
    assert value(found, "vllm:request_success_total", finished_reason="error") == 0
    for phase in ("queue", "prefill", "decode", "inference"):
        assert value(found, f"vllm:request_{phase}_time_seconds_count") == REQUESTS, phase
    assert value(found, "vllm:request_generation_tokens_sum") == REQUESTS * TOKENS
    assert value(found, "vllm:inter_token_latency_seconds_count") == REQUESTS * (TOKENS - 1)
    assert value(found, "vllm:request_decode_time_seconds_sum") > 0
    assert value(found, "vllm:iteration_tokens_total_count") == REQUESTS * TOKENS  # one at a time: a step a token
    info = [labels for (name, labels), v in found.items() if name == "vllm:cache_config_info" and v == 1]
    assert len(info) == 1 and dict(info[0])["num_gpu_blocks"] == "128"
