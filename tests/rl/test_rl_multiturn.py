"""Multi-turn rollouts: each turn continues on the exact earlier tokens; the trainer sees the same numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mm_infer import LLM, SamplingParams
from mm_infer.rl import RolloutRow, generate_multiturn, hf_inputs, masked_logprobs, token_mult_prob_error

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "assets" / "models" / "tiny-qwen2-vl"
IMAGE = REPO / "assets" / "media" / "images" / "photo_q90.jpg"


def _row(truth: str) -> RolloutRow:
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}]
    return RolloutRow({"messages": messages, "multi_modal_data": {"image": [str(IMAGE)]},
                       "mm_processor_kwargs": {"max_pixels": 28 * 28 * 16}}, truth)


def follow_up(row: RolloutRow, turn: int, text: str) -> str | None:
    return ["Tell me more.", "And then?"][turn] if turn < 2 else None


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(str(MODEL))


@torch.no_grad()
def test_turns_are_spliced_exactly_and_match_the_trainer(llm: LLM) -> None:
    from transformers import AutoModelForImageTextToText

    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=5)
    trajs = generate_multiturn(llm.engine, [_row("a")], follow_up, lambda t, g: float(g in t), params, max_turns=3)
    assert len(trajs) == 1 and len(trajs[0]) == 3
    first = llm.engine.prepare(_row("a").prompt)
    pads = llm.engine.placeholder_ids
    image_tokens = first.prompt_token_ids.count(pads.image_pad_id)
    hf = AutoModelForImageTextToText.from_pretrained(str(MODEL), dtype=torch.float32).eval()
    rollout, trainer = [], []
    for traj in trajs[0]:
        assert len(traj.turns) == 3
        assert traj.turns[0].prompt_token_ids == first.prompt_token_ids
        for before, after in zip(traj.turns, traj.turns[1:], strict=False):
            done = before.prompt_token_ids + before.token_ids
            # the next prompt starts with this turn's exact tokens (closed with EOS if max_tokens cut it)
            assert after.prompt_token_ids[: len(done)] == done
        ids = traj.token_ids()
        assert ids.count(pads.image_pad_id) == image_tokens  # media expanded once, never again
        mask = traj.loss_mask()
        assert sum(mask) == sum(len(t.token_ids) for t in traj.turns) == len(traj.logprobs())
        kw = hf_inputs(first, ids[len(first.prompt_token_ids):], image_pad_id=pads.image_pad_id,
                       video_pad_id=pads.video_pad_id)
        rollout.append(traj.logprobs())
        trainer.append(masked_logprobs(hf(**kw).logits, ids, mask))
    assert 1.0 <= token_mult_prob_error(rollout, trainer) <= 1.0001
    # turns after the first diverge per sample, but seeds keep the whole rollout reproducible
    again = generate_multiturn(llm.engine, [_row("a")], follow_up, lambda t, g: 0.0, params, max_turns=3)
    assert [t.token_ids() for t in again[0]] == [t.token_ids() for t in trajs[0]]


def test_multiturn_needs_chat_prompts(llm: LLM) -> None:
    with pytest.raises(ValueError, match="messages"):
        generate_multiturn(llm.engine, [RolloutRow({"prompt": "hi"})], follow_up, lambda t, g: 0.0,
                           SamplingParams(max_tokens=2))
