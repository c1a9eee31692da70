"""SamplingParams semantics: processors, stops, lengths, logprobs modes, prompt logprobs, pad masking."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from engine_cases import IMAGE, VIDEO, case, expand, hf_kwargs, hf_model

from mm_infer import SamplingParams
from mm_infer.engine.sampling.sampler import Sampler
from mm_infer.engine.scheduling.sequence import Sequence, SequenceGroup

PROMPT = case([6, ("image", 1, 4, 8), 10], seed=77)


def one(llm, **kw):
    return llm.generate([PROMPT], SamplingParams(**kw), use_tqdm=False)[0]


def fake_seq(prompt, output, **kw) -> Sequence:
    g = SequenceGroup("x", SamplingParams(**kw), SimpleNamespace(placeholders=[], item_patches=[]))
    seq = Sequence(g, prompt)
    seq.token_ids += output
    seq.seed = g.params.seed or 0
    return seq


@pytest.mark.parametrize("kw", [dict(n=0), dict(temperature=-1), dict(top_p=0), dict(top_k=-2), dict(min_p=2),
                                dict(max_tokens=0), dict(min_tokens=5, max_tokens=2), dict(logprobs_mode="x"),
                                dict(repetition_penalty=0), dict(presence_penalty=3), dict(stop=[""])])
def test_invalid_params_rejected(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)


def test_penalties_match_vllm_semantics():
    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0]])
    seq = fake_seq([0], [1, 1, 2], temperature=0.0, repetition_penalty=2.0, frequency_penalty=0.5,
                   presence_penalty=0.1, logprobs=4, logprobs_mode="processed_logprobs")
    res = Sampler([], [])(logits, [seq])
    expected = torch.log_softmax(torch.tensor([1.0, -3.1, -0.35, 1.0]), -1)
    got = torch.tensor([res.top_logprobs[0][t] for t in range(4)])
    assert torch.allclose(got, expected, atol=1e-6)
    assert res.token_ids == [0]  # ties resolve to the lowest id, as argmax


@pytest.mark.parametrize("kw, kept", [(dict(top_k=2), {0, 1}), (dict(top_p=0.7), {0, 1}), (dict(top_p=0.85), {0, 1, 2}),
                                      (dict(min_p=0.4), {0, 1}), (dict(min_p=0.05), {0, 1, 2, 3})])
def test_truncation_keeps_expected_tokens(kw, kept):
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    seq = fake_seq([0], [], temperature=1.0, logprobs=4, logprobs_mode="processed_logprobs", **kw)
    res = Sampler([], [])(logits, [seq])
    assert {t for t, lp in res.top_logprobs[0].items() if lp > -math.inf} == kept
    draws = {Sampler([], [])(logits, [fake_seq([0], [], temperature=1.0, seed=s, **kw)]).token_ids[0] for s in range(8)}
    assert draws <= kept


def test_min_tokens_masks_eos_and_stop_ids():
    logits = torch.tensor([[0.0, 5.0, 4.0, 1.0]] * 2)
    early = fake_seq([0], [], temperature=0.0, min_tokens=2, stop_token_ids=[2])
    late = fake_seq([0], [3, 3], temperature=0.0, min_tokens=2, stop_token_ids=[2])
    assert Sampler([], [1])(logits, [early, late]).token_ids == [3, 1]


def test_greedy_equivalents_and_logprob_modes(llm):
    greedy = one(llm, temperature=0.0, max_tokens=8, logprobs=3).outputs[0]
    topk1 = one(llm, temperature=0.5, top_k=1, seed=1, max_tokens=8).outputs[0]
    processed = one(llm, temperature=0.5, top_k=1, seed=1, max_tokens=8, logprobs_mode="processed_logprobs")
    assert topk1.token_ids == greedy.token_ids and topk1.logprobs == greedy.logprobs  # raw: before processing
    assert all(lp == 0.0 for lp in processed.outputs[0].logprobs)  # top-1 leaves a single token
    for tok, lp, top in zip(greedy.token_ids, greedy.logprobs, greedy.top_logprobs, strict=True):
        assert len(top) == 3 and max(top, key=top.get) == tok and top[tok] == lp


def test_logit_bias_and_pad_tokens_never_sampled(llm):
    forced = one(llm, temperature=0.0, max_tokens=4, logit_bias={42: 100.0}).outputs[0]
    assert forced.token_ids == [42] * 4
    pads = one(llm, temperature=1.0, seed=0, max_tokens=8, logit_bias={IMAGE: 100.0, VIDEO: 100.0}).outputs[0]
    assert IMAGE not in pads.token_ids and VIDEO not in pads.token_ids and len(pads.token_ids) == 8


def test_eos_ignore_eos_min_tokens_and_stop_token_ids(llm):
    eos = 3002
    stopped = one(llm, temperature=0.0, max_tokens=8, logit_bias={eos: 100.0}).outputs[0]
    assert stopped.token_ids == [eos] and stopped.finish_reason == "stop" and stopped.stop_reason is None
    ignored = one(llm, temperature=0.0, max_tokens=5, logit_bias={eos: 100.0}, ignore_eos=True).outputs[0]
    assert ignored.token_ids == [eos] * 5 and ignored.finish_reason == "length"
    delayed = one(llm, temperature=0.0, max_tokens=8, logit_bias={eos: 100.0}, min_tokens=3).outputs[0]
    assert len(delayed.token_ids) == 4 and delayed.token_ids[-1] == eos and eos not in delayed.token_ids[:3]
    greedy = one(llm, temperature=0.0, max_tokens=10).outputs[0].token_ids
    target = greedy[3]
    cut = one(llm, temperature=0.0, max_tokens=10, stop_token_ids=[target]).outputs[0]
    assert cut.token_ids == greedy[:greedy.index(target) + 1] and cut.stop_reason == target


def test_stop_strings(llm):
    full = one(llm, temperature=0.0, max_tokens=16, skip_special_tokens=True).outputs[0]
    stop = full.text[len(full.text) // 2:len(full.text) // 2 + 3]
    assert stop.strip(), full.text
    cut = one(llm, temperature=0.0, max_tokens=16, stop=[stop]).outputs[0]
    kept = one(llm, temperature=0.0, max_tokens=16, stop=stop, include_stop_str_in_output=True).outputs[0]
    at = full.text.index(stop)
    assert cut.finish_reason == "stop" and cut.stop_reason == stop and cut.text == full.text[:at]
    assert kept.text == full.text[:at + len(stop)]
    assert full.token_ids[:len(cut.token_ids)] == cut.token_ids and len(cut.logprobs) == len(cut.token_ids)
    assert one(llm, temperature=0.0, max_tokens=4, detokenize=False).outputs[0].text == ""
    # catches: stop strings need the text even when the output carries none (detokenize=False)
    silent = one(llm, temperature=0.0, max_tokens=16, stop=[stop], detokenize=False).outputs[0]
    assert silent.token_ids == cut.token_ids and silent.finish_reason == "stop" and silent.text == ""


def test_max_tokens_capped_by_context_length():
    from engine_cases import CKPT

    from mm_infer import LLM

    threads = torch.get_num_threads()
    try:
        small = LLM(str(CKPT), num_kv_blocks=64, max_model_len=len(expand(PROMPT)) + 5, cpu_threads=1)
        out = small.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=None), use_tqdm=False)[0]
    finally:
        torch.set_num_threads(threads)
    assert len(out.outputs[0].token_ids) == 5 and out.outputs[0].finish_reason == "length"


@torch.inference_mode()
def test_prompt_logprobs_match_hf(llm):
    out = one(llm, temperature=0.0, max_tokens=2, prompt_logprobs=0)
    ids = expand(PROMPT)
    logits = hf_model()(**hf_kwargs(PROMPT, ids)).logits[0].float()
    ref = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    assert max(abs(a - b) for a, b in zip(out.prompt_logprobs[1:], ref.tolist(), strict=True)) < 1e-4
    assert out.prompt_top_logprobs is None
    top = one(llm, temperature=0.0, max_tokens=2, prompt_logprobs=3)
    assert top.prompt_top_logprobs[0] is None and len(top.prompt_top_logprobs) == len(ids)
    best = torch.log_softmax(logits[:-1], -1).max(dim=-1).values
    for pos, alts in enumerate(top.prompt_top_logprobs[1:]):
        assert len(alts) == 3 and abs(max(alts.values()) - best[pos].item()) < 1e-4
