"""Text after a long video (temporal grid > h/merge): mrope_after_video="hf" equals HF transformers' generate, and
"vllm" equals an HF forward given vLLM's positions (text resumes at max + 1; vLLM 0.32 measured in docs/video.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mm_infer import LLM, SamplingParams
from mm_infer.prompt.mrope import positions_for_runs
from servers.hf_reference.model import GenParams, HFModel
from servers.hf_reference.prompt import Prompt

REPO = Path(__file__).resolve().parents[2]
CKPT = REPO / "assets" / "models" / "tiny-qwen2-vl"
CKPTS = {"qwen2_vl": CKPT, "qwen2_5_vl": REPO / "assets" / "models" / "tiny-qwen2.5-vl"}
VIDEO = REPO / "assets" / "media" / "videos" / "long_h264_2fps_80.mp4"  # 80 frames at 56x56: grid (40, 4, 4)
PROMPT = {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}],
          "multi_modal_data": {"video": [VIDEO]}}
TOKENS = 6


def test_rules_differ_only_after_a_long_video() -> None:
    # image (1, 4, 4) then video (3, 4, 4): spans within max(h, w)/merge = 2 -> identical; video (6, 4, 4) -> not
    short = [(1, (1, 4, 4), 1.0), (8, (2, 4, 4), 1.0)]
    assert torch.equal(positions_for_runs(20, short, 2, "hf")[0], positions_for_runs(20, short, 2, "vllm")[0])
    long_runs = [(1, (6, 4, 4), 1.0)]  # 24 video tokens at 1..24, t ids 1..6, h/w ids 1..2
    hf, hf_delta = positions_for_runs(27, long_runs, 2, "hf")
    vllm, vllm_delta = positions_for_runs(27, long_runs, 2, "vllm")
    assert hf[:, 25:].tolist() == [[3, 4]] * 3  # start 1 + max(h, w)/merge = 3
    assert vllm[:, 25:].tolist() == [[7, 8]] * 3  # max(t ids) 6 + 1
    assert hf_delta == 5 - 27 and vllm_delta == 9 - 27  # decode resumes after the last prompt position
    with pytest.raises(ValueError, match="unknown mrope_after_video 'nope'"):
        positions_for_runs(27, long_runs, 2, "nope")


@pytest.fixture(scope="module")
def hf() -> HFModel:
    return HFModel(CKPT)


def _ours(rule: str, ckpt: Path = CKPT):
    llm = LLM(str(ckpt), num_kv_blocks=64, mrope_after_video=rule)
    out = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True), use_tqdm=False)
    return llm.engine.preparer.prepare(PROMPT), out[0].outputs[0]


def _hf_prompt(req) -> Prompt:
    from mm_infer.media import PackedTensor

    (item,) = req.items
    packed = PackedTensor(item.pixel_values, torch.tensor([item.grid_thw]), torch.tensor([80]), [item.content_hash])
    return Prompt(list(req.prompt_token_ids), None, packed, [item.second_per_grid_t])


@pytest.mark.parametrize("kind", sorted(CKPTS))
def test_hf_rule_equals_hf_generate(kind: str) -> None:
    # catches: decoding from max(positions) + 1 (HF's rope_deltas) where HF's generate continues the last position
    req, ours = _ours("hf", CKPTS[kind])
    ref = HFModel(CKPTS[kind]).generate(_hf_prompt(req), GenParams(max_tokens=TOKENS, temperature=0.0))
    assert ours.token_ids[:len(ref.token_ids)] == ref.token_ids
    assert max(abs(a - b) for a, b in zip(ours.logprobs, ref.logprobs, strict=False)) < 1e-4


@torch.inference_mode()
def test_vllm_rule_equals_hf_forward_at_vllms_positions(hf: HFModel) -> None:
    req, ours = _ours("vllm")
    _, hf_rule = _ours("hf")
    ids = list(req.prompt_token_ids) + ours.token_ids[:-1]  # teacher-forced: every generated token scored
    n = len(req.prompt_token_ids)
    decode = (torch.arange(n, len(ids)) + req.mrope_delta).expand(3, -1)
    positions = torch.cat([req.mrope_positions, decode], dim=1)[:, None, :]  # [3, 1, L]
    kw = hf.inputs(_hf_prompt(req))
    kw["input_ids"] = torch.tensor([ids])
    kw["attention_mask"] = torch.ones_like(kw["input_ids"])
    kw["mm_token_type_ids"] = torch.cat([kw["mm_token_type_ids"], torch.zeros(1, len(ids) - n, dtype=torch.long)], 1)
    logits = hf.model(**kw, position_ids=positions).logits[0, n - 1:].float()  # [TOKENS, V]
    lp = torch.log_softmax(logits, dim=-1)
    assert lp.argmax(-1).tolist() == ours.token_ids
    ref = lp.gather(1, torch.tensor(ours.token_ids)[:, None])[:, 0].tolist()
    assert max(abs(a - b) for a, b in zip(ours.logprobs, ref, strict=True)) < 1e-4
    # the rule matters on this clip: the two engines disagree (what vLLM vs transformers users see)
    assert max(abs(a - b) for a, b in zip(ours.logprobs, hf_rule.logprobs, strict=True)) > 1e-3
