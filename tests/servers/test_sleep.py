"""Sleep and wake, vLLM's meaning: level 1 frees the KV pool and encoder cache (process RSS drops), level 2 discards
the weights too and a refit must follow; requests meanwhile get a 503 naming why; LLM.sleep() offline."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import httpx
import pytest
from server_cases import CKPT, MEDIA, SMALL, data_url

from mm_infer.engine.control.sleep_state import EngineAsleepError
from mm_infer.engine.sampling.params import SamplingParams
from mm_infer.llm import LLM
from servers.openai.config import ServerConfig
from servers.openai.launch import BackgroundServer, free_port

KV_BYTES = 256 << 20
IMAGE = MEDIA / "images" / "photo_q90.jpg"


def rss_bytes() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.fixture(scope="module")
def sleeper() -> Iterator[BackgroundServer]:
    config = ServerConfig(model_dir=str(CKPT), port=free_port(), enable_sleep_mode=True,
                          extra_served_names=("m",),  # the requests name "m": an unserved name is a 404
                          allowed_weights_paths=(CKPT.parent,),
                          engine_options={"kv_cache_memory_bytes": KV_BYTES, "max_model_len": 1024})
    srv = BackgroundServer(config).start()
    yield srv
    srv.stop()


def _chat(srv) -> httpx.Response:
    content = [{"type": "image_url", "image_url": {"url": data_url(IMAGE, "image/jpeg")}},
               {"type": "text", "text": "What colour is it?"}]
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 5, "min_tokens": 5,
            "temperature": 0.0, "return_token_ids": True, "mm_processor_kwargs": {"max_pixels": SMALL}}
    return httpx.post(f"{srv.base_url}/v1/chat/completions", json=body, timeout=120)


def _tokens(srv) -> list[int]:
    r = _chat(srv)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def _post(srv, path: str, **params) -> httpx.Response:
    return httpx.post(f"{srv.base_url}{path}", params=params, timeout=60)


def _refused(srv, words: str) -> None:
    r = _chat(srv)
    assert r.status_code == 503 and words in r.json()["error"]["message"], r.text


def test_level_1_frees_the_kv_pool_and_encoder_cache_and_wakes_to_the_same_outputs(sleeper):
    core = sleeper.state.backend.core
    before = _tokens(sleeper)
    assert len(core.encoder_cache) == 1
    gc.collect()
    awake = rss_bytes()
    r = _post(sleeper, "/sleep", level=1)
    assert r.json() == {"status": "sleeping", "level": 1}
    gc.collect()
    asleep = rss_bytes()
    print(f"level 1: RSS {awake / 2**20:.0f} MiB -> {asleep / 2**20:.0f} MiB")
    assert awake - asleep >= 0.8 * KV_BYTES, (awake, asleep)
    assert core.runner.kv.k.numel() == 0 and len(core.encoder_cache) == 0
    assert httpx.get(f"{sleeper.base_url}/is_sleeping").json() == {"is_sleeping": True}
    _refused(sleeper, "asleep (level 1")
    assert _post(sleeper, "/wake_up").json() == {"status": "awake", "tags": None}
    assert httpx.get(f"{sleeper.base_url}/is_sleeping").json() == {"is_sleeping": False}
    assert rss_bytes() - asleep >= 0.8 * KV_BYTES  # the pool is back (zeroed, so its pages are touched)
    assert _tokens(sleeper) == before


def test_level_2_discards_the_weights_and_serves_again_only_after_a_refit(sleeper):
    core = sleeper.state.backend.core
    before = _tokens(sleeper)
    gc.collect()
    awake = rss_bytes()
    assert _post(sleeper, "/sleep", level=2).json() == {"status": "sleeping", "level": 2}
    gc.collect()
    asleep = rss_bytes()
    print(f"level 2: RSS {awake / 2**20:.0f} MiB -> {asleep / 2**20:.0f} MiB")
    assert awake - asleep >= 0.8 * KV_BYTES
    assert all(p.numel() == 0 for p in core.model.parameters())
    _refused(sleeper, "asleep (level 2: the KV cache and the weights released)")
    refit = {"model_path": str(CKPT)}
    r = httpx.post(f"{sleeper.base_url}/update_weights_from_disk", json=refit, timeout=60)
    assert r.status_code == 409 and "wake_up?tags=weights" in r.json()["error"]["message"]
    assert _post(sleeper, "/wake_up", tags="weights").json() == {"status": "sleeping", "tags": ["weights"]}
    _refused(sleeper, "the KV cache released")
    assert _post(sleeper, "/wake_up", tags="kv_cache").json()["status"] == "awake"
    _refused(sleeper, "not reloaded since")
    r = httpx.post(f"{sleeper.base_url}/update_weights_from_disk", json=refit, timeout=60)
    assert r.status_code == 200, r.text
    assert _tokens(sleeper) == before


def test_sleep_refusals_name_the_problem(sleeper):
    for params, words in (({"level": 3}, "level must be 1 or 2"), ({"level": 0}, "use /pause"),
                          ({"level": 1, "mode": "keep"}, "mode 'keep'")):
        r = _post(sleeper, "/sleep", **params)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    r = _post(sleeper, "/wake_up", tags="gpu")
    assert r.status_code == 400 and "unknown tags ['gpu']" in r.json()["error"]["message"]
    assert _chat(sleeper).status_code == 200


def test_without_the_flag_sleep_is_a_400_naming_it(server):
    r = httpx.post(f"{server.base_url}/sleep", params={"level": 1}, headers={"Authorization": "Bearer test-key"})
    assert r.status_code == 400 and "--enable-sleep-mode" in r.json()["error"]["message"]


def test_llm_sleep_and_wake_up_offline():
    llm = LLM(str(CKPT), num_kv_blocks=64, max_model_len=512)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    before = llm.generate("hello", params, use_tqdm=False)[0].outputs[0].token_ids
    llm.sleep(1)
    with pytest.raises(EngineAsleepError, match="asleep"):
        llm.generate("hello", params, use_tqdm=False)
    llm.wake_up()
    assert llm.generate("hello", params, use_tqdm=False)[0].outputs[0].token_ids == before
    llm.sleep(2)
    llm.wake_up()
    with pytest.raises(EngineAsleepError, match="not reloaded"):
        llm.generate("hello", params, use_tqdm=False)
    llm.update_weights_from_disk(str(CKPT))
    assert llm.generate("hello", params, use_tqdm=False)[0].outputs[0].token_ids == before
