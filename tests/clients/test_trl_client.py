"""TRL 1.16's real `VLLMClient` (run in .peers/trl-venv, beside vLLM's CPU build) against our server; every
expectation comes from our own endpoints, asked directly. `pytest -m clients`; skipped without the venv."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from client_cases import CKPT, IMAGE, MODEL, TRL_PYTHON, image_url, needs_venv, run_driver

from mm_infer.rl.weight_transfer import WeightTransferClient

pytestmark = [pytest.mark.clients, needs_venv(TRL_PYTHON, "trl")]

TEXT_PROMPTS = ["What colour is the shape?", "How many shapes are there?"]  # as in trl_driver.py
TOKEN_PROMPT = [3001, 1419, 1483, 198, 56, 1356]
TOL = 1e-4


@pytest.fixture(scope="module")
def trl(our_server: str) -> Iterator[dict[str, Any]]:
    """Every driver scenario in one run (importing TRL + vLLM takes ~20 s here). The weight-transfer group is
    opened first by our gloo trainer client: TRL's own `init_communicator` is NCCL-only (scripts/gpu_check.sh)."""
    group = WeightTransferClient(our_server, backend="gloo")
    group.init()
    try:
        results, seconds = run_driver(TRL_PYTHON, "trl_driver.py", [our_server, str(CKPT), str(IMAGE)])
    finally:
        group.close()
    results["driver_seconds"] = seconds
    yield results


def _value(trl: dict[str, Any], name: str) -> Any:
    entry = trl[name]
    assert "error" not in entry, f"{name}: {entry['error']}\n{entry.get('trace', '')}"
    return entry["value"]


def _post(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{base}{path}", json={"model": MODEL, "return_token_ids": True, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= TOL for x, y in zip(a, b, strict=True))


def test_generate_text_prompts_equals_our_completions(trl: dict[str, Any], our_server: str) -> None:
    got = _value(trl, "text")
    ours = _post(our_server, "/v1/completions", {"prompt": TEXT_PROMPTS, "n": 2, "temperature": 0, "max_tokens": 6,
                                                 "logprobs": 2})["choices"]
    assert got["prompt_ids"] == [c["prompt_token_ids"] for c in ours[::2]]
    assert got["completion_ids"] == [c["token_ids"] for c in ours]
    for seq, ids, choice in zip(got["logprobs"], got["logprob_token_ids"], ours, strict=True):
        assert [row[0] for row in ids] == choice["token_ids"]  # greedy: the sampled token ranks first
        assert _close([row[0] for row in seq], choice["logprobs"]["token_logprobs"])
        assert all(len(row) == 2 for row in seq)  # top 2, the sampled token among them


def test_seeded_sampling_keeps_tokens_and_prompt_major_order(trl: dict[str, Any], our_server: str) -> None:
    got = _value(trl, "sampled")
    ours = _post(our_server, "/v1/completions", {"prompt": TEXT_PROMPTS, "n": 3, "temperature": 1.0, "top_k": 50,
                                                 "max_tokens": 6, "seed": 7, "logprobs": 0})["choices"]
    assert got["completion_ids"] == [c["token_ids"] for c in ours]
    assert len({tuple(c) for c in got["completion_ids"]}) > 1, "temperature 1 should give different samples"
    assert all(_close([r[0] for r in seq], c["logprobs"]["token_logprobs"])
               for seq, c in zip(got["logprobs"], ours, strict=True))


def test_generate_from_token_ids(trl: dict[str, Any], our_server: str) -> None:
    got = _value(trl, "token_ids")
    ours = _post(our_server, "/v1/completions", {"prompt": TOKEN_PROMPT, "temperature": 0, "max_tokens": 6,
                                                 "logprobs": 1})["choices"][0]
    assert got["prompt_ids"] == [TOKEN_PROMPT] and got["completion_ids"] == [ours["token_ids"]]
    assert _close([r[0] for r in got["logprobs"][0]], ours["logprobs"]["token_logprobs"])


def _our_image_chat(base: str, max_tokens: int = 6, n: int = 1) -> dict[str, Any]:
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_url()}},
                                         {"type": "text", "text": "What colour is the shape?"}]}]
    return _post(base, "/v1/chat/completions", {"messages": msgs, "temperature": 0, "max_tokens": max_tokens, "n": n,
                                                "logprobs": True, "top_logprobs": 1})


def test_chat_with_an_image_equals_our_chat(trl: dict[str, Any], our_server: str) -> None:
    got = _value(trl, "chat_image")  # TRL re-encodes the PIL image as PNG: the same pixels
    ours = _our_image_chat(our_server)
    assert got["prompt_ids"] == [ours["prompt_token_ids"]]
    assert got["prompt_ids"][0].count(3006) > 1, "the image placeholder is expanded"
    assert got["completion_ids"] == [ours["choices"][0]["token_ids"]]
    want = [t["logprob"] for t in ours["choices"][0]["logprobs"]["content"]]
    assert _close([r[0] for r in got["logprobs"][0]], want)
    assert ours["choices"][0]["message"]["content"] == "red"


def test_get_sequence_logprobs_scores_a_completion_as_it_was_sampled(trl: dict[str, Any]) -> None:
    got = _value(trl, "sequence_logprobs")
    gen, scored = got["generated"], got["scored"]
    completion = gen["completion_ids"][0]
    assert [r[0] for r in scored["actual_token_ids"][0]] == completion
    assert _close([r[0] for r in scored["actual_logprobs"][0]], [r[0] for r in gen["logprobs"][0]])
    assert [r[0] for r in scored["logprob_token_ids"][0]] == completion  # greedy: rank 1 at every position
    assert all(len(r) == 5 and r == sorted(r, reverse=True) for r in scored["logprobs"][0])


def test_get_sequence_logprobs_default_100_is_refused_like_vllm(trl: dict[str, Any]) -> None:
    """TRL's default top_logprobs=100 needs `vllm serve --max-logprobs 100`; ours is vLLM's default cap, 20."""
    err = trl["sequence_logprobs_default_k"].get("error", "")
    assert "400" in err and "maximum of 20" in err


def test_reset_prefix_cache(trl: dict[str, Any]) -> None:
    assert _value(trl, "reset_prefix_cache") is None  # TRL returns nothing; a non-200 would have raised


def test_weight_transfer_info_and_cpu_refusal(trl: dict[str, Any]) -> None:
    assert _value(trl, "weight_info") == {"weight_transfer_config": {"backend": "gloo"}, "world_size": 1}
    # TRL reads /server_info first (a None config would be its RuntimeError), then refuses a non-CUDA device
    assert trl["init_communicator_cpu"]["error"].startswith("NotImplementedError: Weight synchronization runs")


def test_an_empty_weight_update_bracket_leaves_the_server_serving(trl: dict[str, Any], our_server: str) -> None:
    got = _value(trl, "weight_update_bracket")
    assert "409" in got["bracket_error"] and "no weights were received" in got["bracket_error"]
    ours = _post(our_server, "/v1/completions", {"prompt": TEXT_PROMPTS[0], "temperature": 0, "max_tokens": 6})
    assert got["after"]["completion_ids"] == [ours["choices"][0]["token_ids"]]
    assert httpx.get(f"{our_server}/is_paused", timeout=10).json()["is_paused"] is False


def test_multimodal_generate_from_rendered_features_equals_chat(trl: dict[str, Any], our_server: str) -> None:
    """GRPOTrainer's image path: /v1/chat/completions/render for the features, /inference/v1/generate with them."""
    entry = trl["multimodal_generate"]
    if "does not serve `/v1/chat/completions/render`" in entry.get("error", ""):
        pytest.skip("the server has no /v1/chat/completions/render (issue 18 part 3) for TRL's image features")
    got = _value(trl, "multimodal_generate")
    ours = _our_image_chat(our_server, n=2)
    assert got["trainer_prompt_ids"] == ours["prompt_token_ids"]  # the trainer's HF processor = our expansion
    assert got["completion_ids"] == [c["token_ids"] for c in ours["choices"]]
    for seq, c in zip(got["logprobs"], ours["choices"], strict=True):
        assert _close([r[0] for r in seq], [t["logprob"] for t in c["logprobs"]["content"]])
