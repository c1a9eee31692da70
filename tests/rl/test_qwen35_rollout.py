"""RL on tiny Qwen3.5 (dense and MoE): rollouts (images, a video) and multi-turn rollouts are token-exact against a
teacher-forced HF trainer fed by trainer_hf_inputs (Qwen3-VL's inputs, mm_token_type_ids included), and refits
(from disk, in memory with HF's per-expert and GDN names) make the engine follow HF with the new weights."""

from __future__ import annotations

import shutil
from functools import cache
from pathlib import Path

import pytest
import torch
from hybrid_rollout_cases import IMAGES, REPO, VIDEOS, prompt, reward, rows
from safetensors.torch import load_file, save_file

from mm_infer import LLM, SamplingParams
from mm_infer.models.config import load_config
from mm_infer.rl import (
    completion_logprobs,
    generate_multiturn,
    generate_rollouts,
    masked_logprobs,
    token_mult_prob_error,
    trainer_hf_inputs,
)

MODELS = {"dense": REPO / "assets" / "models" / "tiny-qwen3.5", "moe": REPO / "assets" / "models" / "tiny-qwen3.5-moe"}
IMAGE, VIDEO = 3006, 3007  # <|image_pad|> <|video_pad|>
SMALL = {"max_pixels": 32 * 32 * 16, "video_max_pixels": 32 * 32 * 8 * 4}  # at most 16 tokens per image
TOL = 1e-4
GDN = ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b", "linear_attn.in_proj_a",
       "linear_attn.A_log", "linear_attn.dt_bias", "linear_attn.conv1d")


ROWS = rows(SMALL)


@pytest.fixture(scope="module", params=sorted(MODELS))
def kind(request) -> str:
    return request.param


@cache
def llm(kind: str) -> LLM:
    return LLM(str(MODELS[kind]), cpu_threads=1, num_kv_blocks=256)


@cache
def hf(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()


@torch.no_grad()
def test_rollouts_match_a_teacher_forced_hf_trainer(kind):
    config = load_config(MODELS[kind])
    groups = generate_rollouts(llm(kind).engine, ROWS, reward, SamplingParams(n=4, temperature=1.0, seed=3,
                                                                               max_tokens=6))
    rollout, trainer = [], []
    for group in groups:
        assert len({tuple(s.token_ids) for s in group.samples}) > 1
        for sample in group.samples:
            kw = trainer_hf_inputs(config, group.request, sample.token_ids)
            types = kw["mm_token_type_ids"][0].tolist()  # HF's qwen3_5 refuses media without them
            ids = kw["input_ids"][0].tolist()
            assert types == [1 if t == IMAGE else 2 if t == VIDEO else 0 for t in ids] and any(types)
            assert "second_per_grid_ts" not in kw  # Qwen2.5-VL's key; Qwen3.5 places frames by timestamp text
            rollout.append(sample.logprobs)
            trainer.append(completion_logprobs(hf(MODELS[kind])(**kw).logits, sample.token_ids))
    worst = max((torch.tensor(r) - t).abs().max().item() for r, t in zip(rollout, trainer, strict=True))
    error = token_mult_prob_error(rollout, trainer)
    print(f"\nQwen3.5 {kind} rollouts: max |rollout - HF| {worst:.2e}, token_mult_prob_error {error:.8f}")
    assert worst < TOL and 1.0 <= error <= 1.0 + TOL


@torch.no_grad()
def test_hfs_forward_refuses_media_without_token_types(kind):
    # why trainer_hf_inputs must carry mm_token_type_ids for this family
    req = llm(kind).engine.prepare(ROWS[0].prompt)
    kw = trainer_hf_inputs(load_config(MODELS[kind]), req, [])
    del kw["mm_token_type_ids"]
    with pytest.raises(ValueError, match="mm_token_type_ids"):
        hf(MODELS[kind])(**kw)


@torch.no_grad()
def test_multiturn_with_a_video_is_spliced_and_matches_the_trainer(kind):
    row = ROWS[2]
    trajs = generate_multiturn(llm(kind).engine, [row], lambda r, t, x: "And then?" if t == 0 else None,
                               lambda t, g: 0.0, SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=4),
                               max_turns=2)[0]
    first = llm(kind).engine.prepare(row.prompt)
    rollout, trainer = [], []
    for traj in trajs:
        one, two = traj.turns
        assert one.prompt_token_ids == first.prompt_token_ids
        assert two.prompt_token_ids[:len(one.prompt_token_ids) + len(one.token_ids)] == \
            one.prompt_token_ids + one.token_ids
        ids = traj.token_ids()
        assert ids.count(VIDEO) == first.prompt_token_ids.count(VIDEO) > 0  # the video is expanded once
        kw = trainer_hf_inputs(load_config(MODELS[kind]), first, ids[len(first.prompt_token_ids):])
        rollout.append(traj.logprobs())
        trainer.append(masked_logprobs(hf(MODELS[kind])(**kw).logits, ids, traj.loss_mask()))
    assert 1.0 <= token_mult_prob_error(rollout, trainer) <= 1.0 + TOL


def _perturbed(kind: str, tmp_path: Path, pick) -> tuple[Path, dict[str, torch.Tensor]]:
    """A copy of the checkpoint with the tensors `pick` names moved by N(0, 0.05); returns it and those tensors."""
    stored = load_file(str(MODELS[kind] / "model.safetensors"))
    gen = torch.Generator().manual_seed(9)
    moved = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in sorted(stored.items()) if pick(k)}
    ckpt = tmp_path / f"{kind}-refit"
    shutil.copytree(MODELS[kind], ckpt)
    save_file({**stored, **moved}, str(ckpt / "model.safetensors"))
    return ckpt, moved


@torch.no_grad()
def _follows_hf(engine_llm: LLM, model_dir: Path, before: list[float]) -> None:
    """The engine's greedy answer on an image + video prompt scores as HF with model_dir's weights scores it."""
    req = engine_llm.engine.prepare(prompt({"image": [IMAGES / "gray.png"], "video": [VIDEOS / "odd7_h264_2fps.mp4"]},
                                           "Both?", SMALL))
    out = engine_llm.generate([_request(req)], SamplingParams(temperature=0.0, max_tokens=6, logprobs=0),
                              use_tqdm=False)[0].outputs[0]
    kw = trainer_hf_inputs(load_config(model_dir), req, out.token_ids)
    ref = completion_logprobs(hf(model_dir)(**kw).logits, out.token_ids)
    assert (torch.tensor(out.logprobs) - ref).abs().max().item() < TOL
    assert max(abs(a - b) for a, b in zip(out.logprobs, before, strict=False)) > 1e-3, "the refit must move them"


def _request(req) -> dict:
    media = {"image": [IMAGES / "gray.png"], "video": [VIDEOS / "odd7_h264_2fps.mp4"]}
    return {"prompt_token_ids": req.prompt_token_ids, "multi_modal_data": media, "media_tokens_preexpanded": True,
            "mm_processor_kwargs": SMALL}


def _greedy_logprobs(engine_llm: LLM) -> list[float]:
    req = engine_llm.engine.prepare(prompt({"image": [IMAGES / "gray.png"], "video": [VIDEOS / "odd7_h264_2fps.mp4"]},
                                           "Both?", SMALL))
    return engine_llm.generate([_request(req)], SamplingParams(temperature=0.0, max_tokens=6, logprobs=0),
                               use_tqdm=False)[0].outputs[0].logprobs


@pytest.mark.parametrize("group", ["gdn", "experts", "all"])
def test_refits_in_memory_and_from_disk_follow_hf(kind, group, tmp_path):
    # catches: GDN parameters (A_log, dt_bias, conv1d, in_proj_*) or per-expert tensors skipped or misplaced by a
    # refit, a recurrent-state snapshot or encoder output of the old weights reused after it
    if group == "experts" and kind == "dense":
        pytest.skip("the dense checkpoint has no experts")
    picks = {"gdn": lambda k: any(g in k for g in GDN), "experts": lambda k: ".mlp.experts." in k,
             "all": lambda k: True}
    ckpt, moved = _perturbed(kind, tmp_path, picks[group])
    if group == "experts":
        assert any(k.endswith("mlp.experts.7.gate_proj.weight") for k in moved)  # the hub's per-expert names
    if group == "gdn":
        assert {g.rsplit(".", 1)[-1] for g in GDN} <= {k.split("linear_attn.")[1].split(".")[0] for k in moved}
    engine_llm = LLM(str(MODELS[kind]), cpu_threads=1, num_kv_blocks=256)
    before = _greedy_logprobs(engine_llm)  # fills the encoder, prefix and state caches with the old weights
    engine_llm.update_weights(list(moved.items()))  # only the moved tensors, by the hub's names
    _follows_hf(engine_llm, ckpt, before)
    engine_llm.update_weights_from_disk(str(MODELS[kind]))
    assert _greedy_logprobs(engine_llm) == before  # back to the original weights, bit for bit
    engine_llm.update_weights_from_disk(str(ckpt))
    _follows_hf(engine_llm, ckpt, before)
    if group == "all":  # transformers' in-memory names: fused gate_up_proj [E, 2I, D] experts
        engine_llm.update_weights_from_disk(str(MODELS[kind]))
        engine_llm.update_weights(list(hf(ckpt).state_dict().items()))
        _follows_hf(engine_llm, ckpt, before)
