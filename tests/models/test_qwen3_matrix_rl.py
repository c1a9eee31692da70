"""RL on tiny Qwen3-VL (dense and MoE): rollouts are token-exact against a teacher-forced HF trainer
(token_mult_prob_error), and refits (in memory, from disk) make the engine follow HF with the new weights."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
import torch
from qwen3_cases import QWEN3, chat_prompt, hf, hf_completion_logprobs
from safetensors.torch import load_file, save_file

from mm_infer import LLM, SamplingParams
from mm_infer.rl import RolloutRow, generate_rollouts, hf_inputs, token_mult_prob_error

N = 6
ROWS = [
    RolloutRow(chat_prompt(image=["photo_q90.jpg"], text="What colour is it?"), "e"),
    RolloutRow(chat_prompt(image=["tiny_9x13.png", "rgba.png"], text="Compare them."), "a"),
    RolloutRow(chat_prompt(video=["odd7_h264_2fps.mp4"], text="What moves?"), "o"),
]
PROMPT = chat_prompt(image=["photo.png"], video=["odd7_h264_2fps.mp4"], text="What changes?")
GREEDY = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True)


def reward(text: str, truth: str) -> float:
    return float(text.count(truth))


@pytest.fixture(scope="module", params=sorted(QWEN3))
def llm(request) -> Iterator[tuple[str, LLM]]:
    threads = torch.get_num_threads()
    yield request.param, LLM(str(QWEN3[request.param]), cpu_threads=1, num_kv_blocks=256)
    torch.set_num_threads(threads)


@torch.no_grad()
def _hf_greedy(model, llm: LLM, prompt: dict) -> list[int]:
    ids = llm.engine.placeholder_ids
    request = llm.engine.prepare(prompt)
    kw = hf_inputs(request, [], image_pad_id=ids.image_pad_id, video_pad_id=ids.video_pad_id)
    out = model.generate(**kw, max_new_tokens=N, min_new_tokens=N, do_sample=False,  # the engine ignores EOS
                         suppress_tokens=[ids.image_pad_id, ids.video_pad_id])  # and never samples media pads
    return out[0, len(request.prompt_token_ids):].tolist()


def _greedy(llm: LLM) -> list[int]:
    return llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0].token_ids


def test_rollouts_match_a_teacher_forced_trainer(llm):
    kind, llm = llm
    llm.engine.reset_caches()
    calls = llm.engine.stats()["encoder_calls"]
    params = SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=N)
    groups = generate_rollouts(llm.engine, ROWS, reward, params)
    assert llm.engine.stats()["encoder_calls"] - calls == 4  # once per distinct item, not once per sample
    assert [len(g.media) for g in groups] == [1, 2, 1]
    again = generate_rollouts(llm.engine, ROWS, reward, params)
    assert [[s.token_ids for s in g.samples] for g in groups] == [[s.token_ids for s in g.samples] for g in again]
    rollout, trainer = [], []
    for group in groups:
        assert len(group.samples) == 4 and len({tuple(s.token_ids) for s in group.samples}) > 1
        assert group.rewards == [reward(s.text, group.row.ground_truth) for s in group.samples]
        for i, sample in enumerate(group.samples):
            assert group.positions(i).shape == (3, len(group.prompt_token_ids) + len(sample.token_ids))
            rollout.append(sample.logprobs)
            trainer.append(hf_completion_logprobs(kind, llm, group.request, sample.token_ids))
    error = token_mult_prob_error(rollout, trainer)
    assert 1.0 <= error <= 1.0001, f"{kind}: token_mult_prob_error {error}"


def _perturbable(name: str) -> bool:
    """Vision merger, DeepStack mergers, attention of layer 0, and (MoE) the router and the fused expert tensors."""
    return ("merger" in name or "layers.0.self_attn" in name or ".mlp.gate." in name
            or name.endswith(("experts.gate_up_proj", "experts.down_proj")))


def test_update_weights_follows_hf_with_perturbed_weights(llm):
    kind, llm = llm
    model = hf.__wrapped__(kind)  # a fresh copy to perturb: another test may have run the cached one under
    # inference_mode, which can leave HF's MoE weights as inference tensors that no in-place update may touch
    names = [n for n, _ in model.named_parameters() if _perturbable(n)]
    if kind == "qwen3_vl_moe":
        assert sum(n.endswith(("gate_up_proj", "down_proj")) and "experts" in n for n in names) == 4
    before = _greedy(llm)
    llm.generate(PROMPT, GREEDY, use_tqdm=False)  # warm both caches with the old weights
    assert before == _hf_greedy(model, llm, PROMPT)
    original = {n: p.detach().clone() for n, p in model.named_parameters() if n in names}
    version = llm.weight_version
    try:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name in original:
                    param.add_(torch.randn(param.shape, generator=gen) * param.detach().std() * 2)
        assert llm.update_weights([(n, p.detach()) for n, p in model.named_parameters() if n in original]) \
            == version + 1 == llm.weight_version
        after = _greedy(llm)
        assert after == _hf_greedy(model, llm, PROMPT)
        assert after != before  # stale encoder or prefix caches would repeat `before`
    finally:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name in original:
                    param.copy_(original[name])
        llm.update_weights(list(original.items()))
    assert _greedy(llm) == before


def test_update_weights_from_disk_follows_hf(llm, tmp_path):
    from transformers import AutoModelForImageTextToText

    kind, llm = llm
    ckpt = tmp_path / "ckpt"
    shutil.copytree(QWEN3[kind], ckpt)
    weights = load_file(str(ckpt / "model.safetensors"))  # the hub layout: experts [E, H, 2I] and [E, I, H]
    gen = torch.Generator().manual_seed(1)
    moved = [n for n in sorted(weights) if _perturbable(n) or "layers.1." in n]
    for name in moved:
        weights[name] = weights[name] + torch.randn(weights[name].shape, generator=gen) * weights[name].std() * 2
    save_file(weights, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    before = _greedy(llm)
    try:
        llm.update_weights_from_disk(str(ckpt), bucket_bytes=1 << 20)  # several buckets
        after = _greedy(llm)
        perturbed = AutoModelForImageTextToText.from_pretrained(str(ckpt), dtype=torch.float32).eval()
        assert after == _hf_greedy(perturbed, llm, PROMPT)
        assert after != before
    finally:
        llm.update_weights_from_disk(str(QWEN3[kind]))
    assert _greedy(llm) == before
