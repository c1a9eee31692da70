"""vLLM's weight-transfer API over gloo: a trainer process broadcasts new weights; outputs follow HF with them;
a broadcast killed halfway leaves the old weights; every refused call names its problem."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from transfer_cases import CKPT, ask, hf_greedy, report, run_trainer

from mm_infer.engine.control.ops import DiscardWeights, ReceiveWeights
from mm_infer.engine.control.sleep_state import SleepState
from mm_infer.rl.weight_transfer import WeightTransferClient
from mm_infer.serving import BackendFacts
from mm_infer.transfer.receiver import TransferFailedError
from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.weight_transfer import InitInfo, UpdateInfo
from servers.openai.config import ServerConfig
from servers.openai.control.pause import PauseGate
from servers.openai.control.sleep import SleepControl
from servers.openai.control.weight_transfer import TransferSession
from servers.openai.launch import BackgroundServer, free_port


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    config = ServerConfig(model_dir=str(CKPT), port=free_port(), weight_transfer_backend="gloo",
                          engine_options={"num_kv_blocks": 128, "max_model_len": 1024, "batch_invariant": True})
    srv = BackgroundServer(config).start()
    yield srv
    srv.stop()


def _post(server, path: str, body: dict | None = None) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, timeout=60)


def test_server_info_and_world_size(server):
    info = httpx.get(f"{server.base_url}/server_info").json()
    assert info["vllm_config"]["weight_transfer_config"] == {"backend": "gloo"} == info["weight_transfer_config"]
    assert httpx.get(f"{server.base_url}/get_world_size").json() == {"world_size": 1}
    assert _post(server, "/reset_prefix_cache").json() == {"success": True}


def test_gloo_transfer_from_a_trainer_process_follows_hf_with_the_new_weights(server, tmp_path):
    before, v0 = ask(server.base_url)  # warms the encoder and prefix caches with the old weights
    done = report(run_trainer(server.base_url, tmp_path / "new", "--seed", "1"))
    assert done["world_size"] == 2 and done["weight_version"] == v0 + 1 and done["num_tensors"] > 50
    after, v1 = ask(server.base_url)
    assert v1 == v0 + 1
    assert after == hf_greedy(tmp_path / "new", server.state.preparer)
    assert after != before, "the perturbation should change the greedy tokens"


def _wait_for_failure(server, timeout_s: float = 60) -> str:
    """The server's account of the broken broadcast, once it noticed (the next round is refused with it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = _post(server, "/start_weight_update")
        if r.status_code == 409:
            return r.json()["error"]["message"]
        time.sleep(0.2)
    raise AssertionError("the server never noticed the trainer died")


def test_a_broadcast_killed_halfway_leaves_the_old_weights_then_a_new_round_works(server, tmp_path):
    before, v0 = ask(server.base_url)
    died = run_trainer(server.base_url, tmp_path / "dead", "--seed", "2", "--die-after", "3",
                       "--buffer-bytes", str(256 << 10))
    assert died.returncode == 17, died.stderr[-3000:]
    message = _wait_for_failure(server)
    assert "broke off after" in message and "init_weight_transfer_engine" in message
    assert ask(server.base_url) == (before, v0)  # old weights, old version, and the server serves again
    done = report(run_trainer(server.base_url, tmp_path / "next", "--seed", "3"))
    after, v1 = ask(server.base_url)
    assert (v1, done["weight_version"]) == (v0 + 1, v0 + 1)
    assert after == hf_greedy(tmp_path / "next", server.state.preparer)


def test_calls_out_of_order_are_409s_naming_the_missing_step(server):
    fresh = TransferSession("gloo", server.state.backend, PauseGate(server.state.backend),
                            SleepControl(False, server.state.backend, server.state.gate))
    for call in (fresh.start(), fresh.finish(None)):
        with pytest.raises(ApiError) as err:
            asyncio.run(call)
        assert err.value.status == 409 and "/init_weight_transfer_engine first" in err.value.message


def test_bad_init_info_is_a_400_naming_the_field(server):
    r = _post(server, "/init_weight_transfer_engine",
              {"init_info": {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 1}})
    assert r.status_code == 400 and "world_size" in r.json()["error"]["message"]
    r = _post(server, "/init_weight_transfer_engine", {"init_info": {"master_address": "127.0.0.1",
                                                                     "rank_offset": 1, "world_size": 2}})
    assert r.status_code == 400 and "master_port" in r.json()["error"]["message"]
    r = _post(server, "/init_weight_transfer_engine", {"init_info": {"nccl_unique_id_b64": "AAAA", "rank_offset": 1,
                                                                     "world_size": 2}})
    assert r.status_code == 400 and "unique-id" in r.json()["error"]["message"]


def test_nobody_at_the_master_address_is_a_500_saying_so(server):
    r = _post(server, "/init_weight_transfer_engine", {"init_info": {
        "master_address": "127.0.0.1", "master_port": free_port(), "rank_offset": 1, "world_size": 2,
        "timeout_s": 1}})
    assert r.status_code == 500 and "could not join the weight-transfer group" in r.json()["error"]["message"]


def test_nccl_on_a_cpu_server_is_a_400(server):
    session = TransferSession("nccl", server.state.backend, server.state.gate,
                              SleepControl(False, server.state.backend, server.state.gate))
    with pytest.raises(ApiError) as err:
        asyncio.run(session.init(InitInfo(master_address="127.0.0.1", master_port=1, rank_offset=1, world_size=2)))
    assert err.value.status == 400 and "needs CUDA" in err.value.message


def test_bad_update_info_is_a_400_naming_the_tensor_before_any_broadcast(server):
    client = WeightTransferClient(server.base_url, timeout_s=30)
    client.init()
    try:
        cases = [({"names": ["no.such.weight"], "dtype_names": ["float32"], "shapes": [[2]]}, "no.such.weight"),
                 ({"names": ["lm_head.weight", "x"], "dtype_names": ["float32"], "shapes": [[1]]}, "one entry"),
                 ({"names": ["model.embed_tokens.weight"], "dtype_names": ["floaty"], "shapes": [[2]]}, "floaty"),
                 ({"names": ["model.embed_tokens.weight"], "dtype_names": ["float32"], "shapes": [[3, 3]]},
                  "the model wants")]
        for info, named in cases:
            r = _post(server, "/update_weights", {"update_info": info})
            assert r.status_code == 400 and named in r.json()["error"]["message"], r.text
        r = _post(server, "/finish_weight_update", {"weight_version": "step-3"})
        assert r.status_code == 400 and "must be an integer" in r.json()["error"]["message"]
        assert _post(server, "/finish_weight_update").status_code == 409  # no round open
        assert _post(server, "/start_weight_update").status_code == 200
        assert server.state.gate.mode == "wait"  # the round pauses the server
        r = _post(server, "/finish_weight_update", {"weight_version": "7"})
        assert r.status_code == 409 and "no weights were received" in r.json()["error"]["message"]
    finally:
        client.close()
        _post(server, "/resume")
    ask(server.base_url)  # the round left the server running


class _Breaking:
    """An engine whose broadcast always breaks off (the 500 and the round's clean-up, without a trainer)."""

    facts, weight_version = BackendFacts(64, 100, 1), 4

    def __init__(self, reference) -> None:
        self.reference_model, self.discarded = reference, 0

    async def receive_weights(self, update) -> int:
        raise TransferFailedError("the broadcast broke off after 2 of 9 tensors (RuntimeError: peer gone)")

    async def control(self, op) -> object:
        if isinstance(op, ReceiveWeights):
            return await self.receive_weights(op.update)
        if isinstance(op, DiscardWeights):
            self.discarded += 1
        return None

    sleep_state = SleepState()


def test_a_broken_broadcast_is_a_500_that_says_the_old_version_stays(server):
    engine = _Breaking(server.state.backend.reference_model)
    gate = PauseGate(engine)  # type: ignore[arg-type]
    session = TransferSession("gloo", engine, gate, SleepControl(False, engine, gate))  # type: ignore[arg-type]
    session.ready = True
    info = UpdateInfo(names=["model.embed_tokens.weight"], dtype_names=["float32"],
                      shapes=[list(dict(engine.reference_model.named_parameters())["language.embed_tokens.weight"].shape)])
    with pytest.raises(ApiError) as err:
        asyncio.run(session.update(info))
    assert err.value.status == 500 and "keeps weight version 4" in err.value.message
    assert "2 of 9" in err.value.message and engine.discarded == 1 and not gate.paused and not session.ready


def test_weight_transfer_off_is_a_400_naming_the_flag():
    session = TransferSession(None, None, None, None)  # type: ignore[arg-type]
    with pytest.raises(ApiError) as err:
        asyncio.run(session.init(InitInfo(master_address="h", master_port=1, rank_offset=1, world_size=2)))
    assert err.value.status == 400 and "--weight-transfer-config" in err.value.message


def test_a_start_sent_while_an_update_receives_waits_for_it_and_never_leaves_the_server_paused(server):
    """The race the killed-trainer tests met: /start_weight_update polled while the broken broadcast was still
    being noticed reopened a round nobody would finish, and the server stayed paused."""
    engine = _Breaking(server.state.backend.reference_model)
    release = asyncio.Event()

    async def slow_failure(update) -> int:
        await release.wait()
        raise TransferFailedError("the broadcast broke off after 1 of 1 tensors (peer gone)")

    engine.receive_weights = slow_failure  # type: ignore[method-assign]
    info = UpdateInfo(names=["model.embed_tokens.weight"], dtype_names=["float32"],
                      shapes=[list(dict(engine.reference_model.named_parameters())["language.embed_tokens.weight"]
                                   .shape)])

    async def race() -> tuple[BaseException | None, BaseException | None, PauseGate]:
        gate = PauseGate(engine)  # type: ignore[arg-type]
        session = TransferSession("gloo", engine, gate, SleepControl(False, engine, gate))  # type: ignore[arg-type]
        session.ready = True
        update = asyncio.create_task(session.update(info))
        await asyncio.sleep(0.05)
        start = asyncio.create_task(session.start())
        await asyncio.sleep(0.05)
        assert not start.done(), "start must wait for the update under way"
        release.set()
        results = await asyncio.gather(update, start, return_exceptions=True)
        return results[0], results[1], gate  # type: ignore[return-value]

    update_err, start_err, gate = asyncio.run(race())
    assert isinstance(update_err, ApiError) and update_err.status == 500
    assert isinstance(start_err, ApiError) and start_err.status == 409 and "peer gone" in start_err.message
    assert not gate.paused
