"""vLLM's weight-transfer API over gloo on tiny Qwen3.5-MoE: a trainer process broadcasts transformers' in-memory
tensors (fused experts, GDN parameters); the server's greedy answer then follows HF with the new weights."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from transfer_cases import REPO, ask, hf_greedy, report, run_trainer

from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port

MOE = REPO / "assets" / "models" / "tiny-qwen3.5-moe"


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    config = ServerConfig(model_dir=str(MOE), port=free_port(), weight_transfer_backend="gloo",
                          engine_options={"num_kv_blocks": 128, "max_model_len": 1024, "batch_invariant": True})
    srv = BackgroundServer(config).start()
    yield srv
    srv.stop()


def test_gloo_transfer_follows_hf_with_the_new_weights(server, tmp_path):
    # catches: a broadcast tensor of the hybrid MoE (gate_up_proj [E, 2I, D], A_log, conv1d) skipped or misplaced,
    # a recurrent-state snapshot or prefix of the old weights reused after the update
    before, v0 = ask(server.base_url, MOE.name)  # warms the encoder, prefix and state caches with the old weights
    done = report(run_trainer(server.base_url, tmp_path / "new", "--seed", "1", "--model", str(MOE)))
    assert done["world_size"] == 2 and done["weight_version"] == v0 + 1 and done["num_tensors"] > 100
    after, v1 = ask(server.base_url, MOE.name)
    assert v1 == v0 + 1
    assert after == hf_greedy(tmp_path / "new", server.state.preparer)
    assert after != before, "the perturbation should change the greedy tokens"
