"""`mm-infer serve --replicas 2 --ray-address ADDR` in its own process: joins the cluster, serves, stops."""

from __future__ import annotations

import signal
import time

import httpx
import ray
from replica_cases import CKPT
from serve_process import start_serve, stop_serve

from servers.cli import build_parser
from servers.openai.launch import free_port


def test_replica_arguments_parse():
    args = build_parser().parse_args(["serve", str(CKPT), "--replicas", "3", "--ray-address", "10.0.0.1:6379"])
    assert (args.replicas, args.ray_address) == (3, "10.0.0.1:6379")
    assert build_parser().parse_args(["serve", str(CKPT)]).replicas is None


def test_serve_with_replicas_joins_a_ray_cluster_and_stops_cleanly(local_ray):
    address = ray.get_runtime_context().gcs_address
    proc, base = start_serve([str(CKPT), "--replicas", "2", "--ray-address", address, "--max-model-len", "256",
                              "--num-kv-blocks", "64"], free_port())
    try:
        metrics = httpx.get(f"{base}/metrics").text
        assert "mm_infer_replicas_up 2" in metrics
        body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "ignore_eos": True}
        reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60).json()
        assert reply["usage"]["completion_tokens"] == 4 and reply["weight_version"] == 0
        assert httpx.get(f"{base}/v1/models").json()["data"][0]["max_model_len"] == 256
    finally:
        printed = stop_serve(proc)
    # uvicorn shuts down gracefully, restores the handler it found (Ray's, which exits with the signal number)
    # and re-raises the signal
    assert proc.returncode in (0, -signal.SIGTERM, signal.SIGTERM)
    assert "Application shutdown complete" in printed
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < 2:  # the server's replicas were killed, not left behind
        assert time.monotonic() < deadline, f"replica actors outlived the server: {ray.available_resources()}"
        time.sleep(0.2)
