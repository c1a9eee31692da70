"""Tensor parallelism at 2 ranks on gloo (one process each) against one process, on every tiny Qwen checkpoint:
greedy ids equal, every logprob within 1e-5; the deterministic mode is batch-invariant; a refit lands on every
rank; a killed rank fails the step with RankLostError, and its engine is not left half-alive."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import torch
from tp_cases import ENGINE, GREEDY, MODELS, max_logprob_gap, prompts, token_ids

from mm_infer import LLM, SamplingParams
from mm_infer.models import load_model
from mm_infer.parallel.group import RankLostError

CHECKPOINTS = ["tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3-vl", "tiny-qwen3-vl-moe"]
BOUND = 1e-5


@pytest.fixture(scope="module", params=CHECKPOINTS)
def pair(request) -> Iterator[tuple[str, LLM, LLM]]:
    one = LLM(str(MODELS / request.param), **ENGINE)
    with LLM(str(MODELS / request.param), tensor_parallel_size=2, **ENGINE) as two:
        yield request.param, one, two


def test_tp2_greedy_ids_and_logprobs_equal_tp1(pair):
    name, one, two = pair
    a, b = one.generate(prompts(), GREEDY), two.generate(prompts(), GREEDY)
    assert [o.prompt_token_ids for o in a] == [o.prompt_token_ids for o in b]
    assert token_ids(a) == token_ids(b)
    gap = max_logprob_gap(a, b)
    print(f"{name}: TP=2 against TP=1, largest logprob gap {gap:.2e}")
    assert gap <= BOUND


def test_a_refit_at_tp2_equals_the_same_refit_at_tp1(pair, tmp_path):
    name, one, two = pair
    whole, _ = load_model(MODELS / name)
    gen = torch.Generator().manual_seed(5)
    perturbed = [(f"model.language_model.{k.removeprefix('language.')}" if k.startswith("language.") else k,
                  p + 0.05 * torch.randn(p.shape, generator=gen)) for k, p in whole.named_parameters()
                 if k.startswith("language.layers.0.")]
    perturbed[0] = (perturbed[0][0], perturbed[0][1].half())  # any dtype crosses to the ranks (as bytes)
    before = two.generate(prompts()[:2], GREEDY)
    for llm in (one, two):
        llm.update_weights(perturbed, version=7)
    a, b = one.generate(prompts()[:2], GREEDY), two.generate(prompts()[:2], GREEDY)
    assert token_ids(a) == token_ids(b) and max_logprob_gap(a, b) <= BOUND
    assert abs(before[0].prompt_logprobs[-1] - b[0].prompt_logprobs[-1]) > 1e-3, "the refit should change them"
    assert two.weight_version == 7
    for llm in (one, two):
        llm.update_weights_from_disk(str(MODELS / name))  # back to the checkpoint: each rank rereads its slices
    restored = two.generate(prompts()[:2], GREEDY)
    assert token_ids(restored) == token_ids(before) and max_logprob_gap(restored, before) == 0.0


def test_sleep_wake_and_an_abort_mid_request_keep_the_ranks_in_step(pair):
    name, one, two = pair
    want = one.generate(prompts()[:1], GREEDY)
    two.sleep(1)
    two.wake_up()
    engine = two.engine
    long = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    engine.add_request("dropped", {"prompt": "This one is aborted"}, long)
    for _ in range(3):
        engine.step()
    engine.abort("dropped")
    while engine.has_unfinished():
        engine.step()  # a rank that kept the aborted request would fail the next step's checksum
    got = two.generate(prompts()[:1], GREEDY)
    assert token_ids(got) == token_ids(want) and max_logprob_gap(got, want) <= BOUND


def test_deterministic_tp2_gives_a_request_the_same_bits_alone_and_in_a_batch_of_16():
    target = prompts()[1]
    others = [{"prompt": "word " * (3 + 5 * i)} for i in range(13)] + prompts()[2:]
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=8, ignore_eos=True, logprobs=5, prompt_logprobs=2)
    with LLM(str(MODELS / "tiny-qwen2-vl"), tensor_parallel_size=2, tp_deterministic=True, batch_invariant=True,
             **ENGINE) as llm:
        alone = llm.generate([target], params)[0]
        batch = llm.generate([*others[:7], target, *others[7:]], params)
    together = batch[7]
    assert len(batch) == 16 and together.prompt_token_ids == alone.prompt_token_ids
    assert token_ids([together]) == token_ids([alone])
    assert max_logprob_gap([together], [alone]) == 0.0  # bit for bit


def test_a_killed_rank_fails_the_next_step_with_rank_lost_and_close_still_returns():
    llm = LLM(str(MODELS / "tiny-qwen2-vl"), tensor_parallel_size=2, **ENGINE)
    engine = llm.engine
    engine.add_request("doomed", {"prompt": "a long answer"}, SamplingParams(max_tokens=200, ignore_eos=True))
    engine.step()
    follower = engine.followers[0]
    os.kill(follower.pid, signal.SIGKILL)
    follower.wait()
    with pytest.raises(RankLostError, match="tensor-parallel rank is gone"):
        for _ in range(200):
            engine.step()
    llm.close()
    assert engine.followers == []


def test_tp4_with_kv_heads_replicated_equals_tp1():
    # 4 ranks over 2 KV heads: each rank keeps one KV head (two ranks share each) and one q head
    one = LLM(str(MODELS / "tiny-qwen2-vl"), **ENGINE)
    with LLM(str(MODELS / "tiny-qwen2-vl"), tensor_parallel_size=4, tp_deterministic=True, **ENGINE) as four:
        assert four.engine.runner.kv.k.shape[1] == 1  # [layers, KV heads on this rank, slots, head dim]
        a, b = one.generate(prompts()[:2], GREEDY), four.generate(prompts()[:2], GREEDY)
    assert token_ids(a) == token_ids(b) and max_logprob_gap(a, b) <= BOUND


def test_a_rank_that_dies_while_starting_fails_the_start_with_its_exit_code(monkeypatch):
    monkeypatch.setattr("sys.executable", "/bin/false")  # the follower's interpreter: exits 1 at once
    with pytest.raises(RankLostError, match="tensor-parallel rank 1 exited with code 1 while starting"):
        LLM(str(MODELS / "tiny-qwen2-vl"), tensor_parallel_size=2, **ENGINE)


def test_a_model_that_cannot_split_is_refused_before_any_rank_starts(monkeypatch):
    monkeypatch.setattr("subprocess.Popen", None)  # no process may start
    with pytest.raises(ValueError, match="hybrid"):
        LLM(str(MODELS / "tiny-qwen3.5"), tensor_parallel_size=2, **ENGINE)
    with pytest.raises(ValueError, match="num_attention_heads = 4 does not split over 3"):
        LLM(str(MODELS / "tiny-qwen2-vl"), tensor_parallel_size=3, **ENGINE)
