"""The committed tiny-shapes-vl checkpoint answers held-out questions through mm_infer.LLM, exactly as HF does."""

from pathlib import Path

import pytest

from mm_infer.data import TASKS, ChatEncoder, make_split
from mm_infer.data.answerers import HFAnswerer, OfflineAnswerer, engine_prompt, normalize

CKPT = Path(__file__).resolve().parents[2] / "assets" / "models" / "tiny-shapes-vl"

HELD_OUT_SEED = 1000  # training used seed 0


@pytest.fixture(scope="module")
def samples():
    return make_split(HELD_OUT_SEED, 3, TASKS)[:10]  # every task at least twice


@pytest.fixture(scope="module")
def offline():
    return OfflineAnswerer(CKPT)


def test_engine_prompt_is_the_training_prompt(samples, offline):
    enc = ChatEncoder.from_dir(CKPT)
    for s in samples[:4]:
        assert offline.llm.engine.prepare(engine_prompt(s)).prompt_token_ids == enc.encode(s).prompt_ids


def test_offline_engine_answers_held_out_questions_like_hf(samples, offline):
    ours = offline.answer(samples, max_tokens=6)
    ref = HFAnswerer(CKPT).answer(samples, max_tokens=6)
    assert [a.token_ids for a in ours] == [r.token_ids for r in ref]
    correct = sum(normalize(a.text) == s.answer for a, s in zip(ours, samples, strict=True))
    assert correct >= 8, [(s.task, s.answer, a.text) for a, s in zip(ours, samples, strict=True)]
