"""Rollouts are token-exact against a teacher-forced HF trainer; refits invalidate every weight-derived cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mm_infer import LLM, SamplingParams
from mm_infer.rl import (
    RolloutAbortedError,
    RolloutRow,
    completion_logprobs,
    generate_rollouts,
    group_advantages,
    hf_inputs,
    token_mult_prob_error,
)

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "assets" / "models" / "tiny-qwen2-vl"
IMAGES = REPO / "assets" / "media" / "images"
VIDEO = REPO / "assets" / "media" / "videos" / "odd7_h264_2fps.mp4"
SMALL = {"max_pixels": 28 * 28 * 16}


def _row(media: dict, question: str, truth: str) -> RolloutRow:
    parts = [{"type": kind} for kind, items in media.items() for _ in items]
    messages = [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}]
    return RolloutRow({"messages": messages, "multi_modal_data": media, "mm_processor_kwargs": SMALL}, truth)


ROWS = [
    _row({"image": [str(IMAGES / "photo_q90.jpg")]}, "What colour is it?", "e"),
    _row({"image": [str(IMAGES / "tiny_9x13.png"), str(IMAGES / "rgba.png")]}, "Compare them.", "a"),
    _row({"video": [str(VIDEO)]}, "What moves?", "o"),
]


def reward(text: str, truth: str) -> float:
    return float(text.count(truth))


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(str(MODEL))


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(MODEL), dtype=torch.float32).eval()


def _pads(llm: LLM) -> dict[str, int]:
    ids = llm.engine.placeholder_ids
    return {"image_pad_id": ids.image_pad_id, "video_pad_id": ids.video_pad_id}


@torch.no_grad()
def test_rollout_logprobs_match_teacher_forced_trainer(llm: LLM, hf) -> None:
    params = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=6)
    llm.engine.reset_caches()
    calls = llm.engine.stats()["encoder_calls"]
    groups = generate_rollouts(llm.engine, ROWS, reward, params)
    assert llm.engine.stats()["encoder_calls"] - calls == 4  # once per distinct item, not once per sample
    assert [len(g.media) for g in groups] == [1, 2, 1]  # media stored once per group
    again = generate_rollouts(llm.engine, ROWS, reward, params)
    assert [[s.token_ids for s in g.samples] for g in groups] == [[s.token_ids for s in g.samples] for g in again]
    rollout, trainer = [], []
    for group in groups:
        assert len(group.samples) == 4 and group.weight_version == 0
        assert [s.reward for s in group.samples] == [reward(s.text, group.row.ground_truth) for s in group.samples]
        for i, sample in enumerate(group.samples):
            assert len(sample.logprobs) == len(sample.token_ids) > 0
            logits = hf(**hf_inputs(group.request, sample.token_ids, **_pads(llm))).logits
            rollout.append(sample.logprobs)
            trainer.append(completion_logprobs(logits, sample.token_ids))
            assert group.positions(i).shape == (3, len(group.prompt_token_ids) + len(sample.token_ids))
    error = token_mult_prob_error(rollout, trainer)
    assert 1.0 <= error <= 1.0001, error


def test_group_advantages() -> None:
    adv = group_advantages([1.0, 0.0, 1.0, 0.0])
    assert adv == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-5)
    assert group_advantages([2.0, 2.0]) == [0.0, 0.0]


@torch.no_grad()
def _hf_greedy(hf, llm: LLM, prompt: dict, n: int) -> list[int]:
    request = llm.engine.prepare(prompt)
    kw = hf_inputs(request, [], **_pads(llm))
    out = hf.generate(**kw, max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(request.prompt_token_ids):].tolist()


def test_refit_invalidates_encoder_and_prefix_caches(llm: LLM, hf) -> None:
    prompt = ROWS[0].prompt
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    before = llm.generate([prompt, prompt], greedy, use_tqdm=False)  # second one hits both caches
    assert before[0].outputs[0].token_ids == before[1].outputs[0].token_ids == _hf_greedy(hf, llm, prompt, 8)
    original = {k: v.clone() for k, v in hf.state_dict().items() if ".visual." in k or k.startswith("visual.")}
    try:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, param in hf.named_parameters():
                if "visual" in name and "merger" in name:
                    param.add_(torch.randn(param.shape, generator=gen) * 0.5)
        llm.engine.update_weights([(n, p.detach()) for n, p in hf.named_parameters() if "visual" in n], version=1)
        after = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids
        assert after == _hf_greedy(hf, llm, prompt, 8)
        assert after != before[0].outputs[0].token_ids  # a stale encoder or prefix cache would repeat `before`
    finally:
        with torch.no_grad():
            state = hf.state_dict()
            for k, v in original.items():
                state[k].copy_(v)
        llm.engine.update_weights([(n, p.detach()) for n, p in hf.named_parameters() if "visual" in n], version=2)


def test_aborted_rollout_is_an_error_with_its_partial_output(llm: LLM, monkeypatch) -> None:
    engine = llm.engine
    real_step = engine.step
    calls = {"n": 0}

    def step_then_abort():
        calls["n"] += 1
        out = real_step()
        if calls["n"] == 2:
            engine.abort(next(iter(engine.groups)))
        return out

    monkeypatch.setattr(engine, "step", step_then_abort)
    with pytest.raises(RolloutAbortedError, match="aborted") as info:
        generate_rollouts(engine, ROWS[:1], reward, SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=8))
    assert all(c.finish_reason == "abort" for c in info.value.partial.outputs)
    monkeypatch.undo()
    assert not engine.has_unfinished()


def test_update_weights_from_disk_bumps_version_and_matches_hf(llm: LLM, tmp_path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForImageTextToText

    shutil.copytree(MODEL, tmp_path / "ckpt")
    weights = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    gen = torch.Generator().manual_seed(1)
    for name in weights:
        if "visual" in name or "layers.1." in name:
            weights[name] = weights[name] + torch.randn(weights[name].shape, generator=gen) * 0.05
    save_file(weights, str(tmp_path / "ckpt" / "model.safetensors"))
    prompt = ROWS[2].prompt  # the video row
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    start = llm.weight_version
    before = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids
    try:
        assert llm.update_weights_from_disk(str(tmp_path / "ckpt")) == start + 1 == llm.weight_version
        after = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids
        perturbed = AutoModelForImageTextToText.from_pretrained(str(tmp_path / "ckpt"), dtype=torch.float32).eval()
        assert after == _hf_greedy(perturbed, llm, prompt, 6)
        assert after != before
    finally:
        llm.update_weights_from_disk(str(MODEL))
    assert llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids == before
    from mm_infer.rl.weights import WeightFileError

    del weights["lm_head.weight"]
    weights["model.layers.0.mlp.gate_proj.weight"] = torch.zeros(3, 3)
    save_file(weights, str(tmp_path / "ckpt" / "model.safetensors"))
    version = llm.weight_version
    with pytest.raises(WeightFileError, match="gate_proj"):
        llm.update_weights_from_disk(str(tmp_path / "ckpt"))
    assert llm.weight_version == version  # checked before anything was loaded
    assert llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids == before
