"""vLLM's weight-transfer API at -tp 2: the trainer process broadcasts to rank 0 of the engine, which hands each
rank its slices; the greedy answer then follows HF with the new weights, and the transfer world stays 2."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from transfer_cases import CKPT, ask, hf_greedy, report, run_trainer

from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    config = ServerConfig(model_dir=str(CKPT), port=free_port(), weight_transfer_backend="gloo",
                          engine_options={"num_kv_blocks": 128, "max_model_len": 1024, "tensor_parallel_size": 2,
                                          "cpu_threads": 1})
    srv = BackgroundServer(config).start()
    yield srv
    srv.stop()


def test_a_trainer_broadcast_fills_both_ranks_and_outputs_follow_hf(server, tmp_path):
    assert httpx.get(f"{server.base_url}/get_world_size").json() == {"world_size": 1}  # rank 0 joins for both
    before, v0 = ask(server.base_url)
    done = report(run_trainer(server.base_url, tmp_path / "new", "--seed", "1"))
    assert done["world_size"] == 2 and done["weight_version"] == v0 + 1
    after, v1 = ask(server.base_url)
    assert v1 == v0 + 1 and after != before
    assert after == hf_greedy(tmp_path / "new", server.state.preparer)
