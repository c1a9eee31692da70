"""Weight refits over HTTP: outputs follow the new weights exactly (HF generate); caches never go stale."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file
from server_cases import API_KEY, CKPT, MEDIA, SMALL, data_url

from mm_infer.rl import hf_inputs

AUTH = {"Authorization": f"Bearer {API_KEY}"}
IMAGE = MEDIA / "images" / "photo_q90.jpg"
QUESTION = "What colour is it?"
N = 8


def _new_layout(name: str) -> str:
    """transformers 5 names: model.visual.*, model.language_model.* (the tiny checkpoint has the legacy ones)."""
    if name.startswith("visual."):
        return f"model.{name}"
    return name.replace("model.", "model.language_model.", 1) if name.startswith("model.") else name


def _perturbed_checkpoint(dst: Path) -> Path:
    """A full copy of the tiny checkpoint, saved with the new names, whose visual.merger moved by N(0, 0.5)."""
    shutil.copytree(CKPT, dst)
    tensors = load_file(str(CKPT / "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    for name in sorted(tensors):
        if name.startswith("visual.merger."):
            tensors[name] = tensors[name] + torch.randn(tensors[name].shape, generator=gen) * 0.5
    save_file({_new_layout(k): v for k, v in tensors.items()}, str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    return dst


@torch.no_grad()
def _hf_greedy(model_dir: Path, llm, prompt: dict) -> list[int]:
    from transformers import AutoModelForImageTextToText

    hf = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = llm.engine.placeholder_ids
    request = llm.engine.prepare(prompt)
    kw = hf_inputs(request, [], image_pad_id=ids.image_pad_id, video_pad_id=ids.video_pad_id)
    out = hf.generate(**kw, max_new_tokens=N, min_new_tokens=N, do_sample=False,  # the engine masks EOS likewise
                      suppress_tokens=[ids.image_pad_id, ids.video_pad_id])  # and never samples media pads
    return out[0, len(request.prompt_token_ids):].tolist()


def _ask(client) -> tuple[list[int], list[int], int]:
    content = [{"type": "image_url", "image_url": {"url": data_url(IMAGE, "image/jpeg")}},
               {"type": "text", "text": QUESTION}]
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}], max_tokens=N, temperature=0.0,
        extra_body={"min_tokens": N, "return_token_ids": True, "mm_processor_kwargs": {"max_pixels": SMALL}})
    return r.model_extra["prompt_token_ids"], r.choices[0].model_extra["token_ids"], r.model_extra["weight_version"]


def _refit(server, path: Path | str, **extra) -> httpx.Response:
    return httpx.post(f"{server.base_url}/update_weights_from_disk", json={"model_path": str(path), **extra},
                      headers=AUTH, timeout=120)


def _version(server) -> int:
    return httpx.get(f"{server.base_url}/weight_version", headers=AUTH).json()["weight_version"]


def test_refit_from_disk_follows_hf_with_the_weights_of_the_time(server, client, llm, tmp_path):
    prompt = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
              "multi_modal_data": {"image": [IMAGE]}, "mm_processor_kwargs": {"max_pixels": SMALL}}
    perturbed = _perturbed_checkpoint(tmp_path / "ckpt")
    core = server.state.backend.core
    _ask(client)  # warm the encoder and prefix caches with the old weights
    prompt_ids, before, v0 = _ask(client)
    assert prompt_ids == llm.engine.prepare(prompt).prompt_token_ids
    assert before == _hf_greedy(CKPT, llm, prompt)
    try:
        r = _refit(server, perturbed, bucket_bytes=64 * 1024)
        assert r.status_code == 200, r.text
        assert r.json()["weight_version"] == v0 + 1 == _version(server) and r.json()["num_buckets"] > 1
        models = httpx.get(f"{server.base_url}/v1/models", headers=AUTH).json()["data"]
        assert models[0]["weight_version"] == v0 + 1
        calls = core.stats()["encoder_calls"]
        _, after, v1 = _ask(client)
        assert core.stats()["encoder_calls"] == calls + 1, "a cached embedding of the old weights was reused"
        assert v1 == v0 + 1
        assert after != before, "the perturbed merger must change the greedy tokens"
        assert after == _hf_greedy(perturbed, llm, prompt)
    finally:
        restored = _refit(server, CKPT, weight_version=v0 + 10)
    assert restored.status_code == 200 and _version(server) == v0 + 10
    _, again, v2 = _ask(client)
    assert again == before and v2 == v0 + 10


def test_refit_rejects_bad_directories_without_loading(server, tmp_path):
    version = _version(server)
    assert _refit(server, tmp_path / "missing").status_code == 400
    (tmp_path / "empty").mkdir()
    assert _refit(server, tmp_path / "empty").status_code == 400
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file({"visual.merger.mlp.0.bias": torch.zeros(3), "model.norm.weight": torch.full((128,), 7.0)},
              str(bad / "model.safetensors"))
    r = _refit(server, bad)
    assert r.status_code == 400 and "shape" in r.json()["error"]["message"]
    save_file({"not.a.weight": torch.zeros(3)}, str(bad / "model.safetensors"))
    assert _refit(server, bad).status_code == 400
    (bad / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    assert _refit(server, bad).status_code == 400
    assert _version(server) == version
    norm = server.state.backend.core.model.language.norm.weight
    assert not torch.all(norm == 7.0), "a rejected directory must load nothing"


def test_refit_reads_only_under_the_allowed_paths(server):
    """F18: /update_weights_from_disk read any readable directory."""
    r = _refit(server, "/etc")
    assert r.status_code == 403 and "--allowed-weights-path" in r.json()["error"]["message"]
    assert _refit(server, f"{CKPT}{'/..' * len(CKPT.parts)}/etc").status_code == 403  # resolved before the check


def test_non_finite_weights_are_refused_unless_allowed(server, client, tmp_path):
    """F18: NaN weights were accepted, and every later request sampled garbage."""
    version = _version(server)
    bad = tmp_path / "nan"
    shutil.copytree(CKPT, bad)
    tensors = load_file(str(CKPT / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"].clone()
    tensors["model.norm.weight"][3] = float("nan")
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    r = _refit(server, bad)
    assert r.status_code == 400 and "'model.norm.weight'" in r.json()["error"]["message"]
    assert _version(server) == version and torch.isfinite(server.state.backend.core.model.language.norm.weight).all()
    try:
        assert _refit(server, bad, allow_nonfinite=True).status_code == 200
        assert torch.isnan(server.state.backend.core.model.language.norm.weight).any()
    finally:
        assert _refit(server, CKPT).status_code == 200  # the original weights back for the tests after this one


def test_reset_prefix_cache_recomputes_but_changes_nothing(server, client):
    core = server.state.backend.core
    _, first, _ = _ask(client)
    r = httpx.post(f"{server.base_url}/reset_prefix_cache", headers=AUTH)
    assert r.status_code == 200 and r.json() == {"success": True}
    calls = core.stats()["encoder_calls"]
    _, second, _ = _ask(client)
    assert core.stats()["encoder_calls"] == calls + 1 and second == first


@pytest.mark.parametrize("path", ["/pause", "/resume", "/update_weights_from_disk", "/reset_prefix_cache"])
def test_control_routes_need_the_api_key(server, path):
    assert httpx.post(f"{server.base_url}{path}", json={}).status_code == 401


def test_sharded_checkpoint_is_planned_from_its_index_and_read_in_bounded_buckets(llm, tmp_path):
    import json

    from mm_infer.rl.weights import plan_refit, read_buckets

    tensors = load_file(str(CKPT / "model.safetensors"))
    names = sorted(tensors)
    shards = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2:]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / file))
    save_file({"ignored": torch.zeros(1)}, str(tmp_path / "stray.safetensors"))  # not in the index
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    entries = plan_refit(tmp_path, llm.engine.model)
    assert sorted(e.name for e in entries) == sorted(n for n in names if n != "lm_head.weight" or
                                                     llm.engine.model.lm_head is not None)
    limit = 32 * 1024
    buckets = list(read_buckets(entries, limit))
    assert [n for b in buckets for n, _ in b] == [e.name for e in entries]
    for bucket in buckets:
        size = sum(t.numel() * 4 for _, t in bucket)
        assert size <= limit or len(bucket) == 1
        assert all(torch.equal(t, tensors[n]) for n, t in bucket)
