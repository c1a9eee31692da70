"""Weight transfer through 2 Ray replicas: each joins the trainer's gloo group at its own rank; all swap in together,
a broadcast killed halfway leaves the old weights on every replica, and a restarted replica catches up."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import ray
from replica_cases import CKPT, OPTIONS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rl"))
from transfer_cases import ask, hf_greedy, report, run_trainer  # noqa: E402

from servers.openai.config import ServerConfig  # noqa: E402
from servers.openai.launch import BackgroundServer, free_port  # noqa: E402


@pytest.fixture(scope="module")
def served(local_ray: None) -> Iterator[BackgroundServer]:
    config = ServerConfig(model_dir=str(CKPT), port=free_port(), weight_transfer_backend="gloo", replicas=2,
                          engine_options={**OPTIONS, "num_kv_blocks": 128})
    srv = BackgroundServer(config).start()
    yield srv
    srv.stop()


def _checksums(srv) -> list[float]:
    """Each replica's sum over all its parameters (read inside the actor)."""
    def total(replica) -> float:
        return float(sum(p.double().sum() for p in replica.core.model.parameters()))

    return [ray.get(s.handle.__ray_call__.remote(total)) for s in srv.state.backend.supervisor.slots]


def _failure(srv, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = httpx.post(f"{srv.base_url}/start_weight_update", timeout=60)
        if r.status_code == 409:
            return r.json()["error"]["message"]
        time.sleep(0.2)
    raise AssertionError("the server never noticed the trainer died")


def test_two_replicas_join_at_their_own_ranks_and_swap_in_together(served, tmp_path):
    assert httpx.get(f"{served.base_url}/get_world_size").json() == {"world_size": 2}
    old = _checksums(served)
    assert old[0] == old[1]
    done = report(run_trainer(served.base_url, tmp_path / "new", "--seed", "5"))
    assert done["world_size"] == 3 and done["weight_version"] == 1
    new = _checksums(served)
    assert new[0] == new[1] != old[0]
    want = hf_greedy(tmp_path / "new", served.state.preparer)
    for _ in range(4):  # the router spreads them over both replicas; every answer is the new weights'
        assert ask(served.base_url) == (want, 1)
    journal = served.state.backend.supervisor.journal.since(-1)
    assert journal and journal[-1].version == 1  # a restarted replica replays the transfer


def test_a_broadcast_killed_halfway_leaves_the_old_weights_on_every_replica(served, tmp_path):
    old, (tokens, version) = _checksums(served), ask(served.base_url)
    died = run_trainer(served.base_url, tmp_path / "dead", "--seed", "6", "--die-after", "3",
                       "--buffer-bytes", str(256 << 10))
    assert died.returncode == 17, died.stderr[-3000:]
    assert "broke off after" in _failure(served)
    assert _checksums(served) == old
    assert ask(served.base_url) == (tokens, version)
