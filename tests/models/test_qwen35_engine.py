"""The engine on tiny Qwen3.5 (dense and MoE), float32 CPU: greedy ids equal HF generate through the real chat and
media path, logprobs a teacher-forced HF forward, and the shared recurrent-state cache exact (hit = cold, n=8 = 8
requests, preemption)."""

from __future__ import annotations

import pytest
import torch
from qwen3_cases import QWEN35, chat_prompt, hf

from mm_infer import LLM, SamplingParams
from mm_infer.rl import completion_logprobs, hf_inputs

PROMPTS = {
    "40-token image": chat_prompt(image=["tiny_9x13.png"]),
    "text": chat_prompt(text="def f(x): return x"),
    "image": chat_prompt(image=["photo.png"]),
    "video": chat_prompt(video=["odd7_h264_2fps.mp4"]),
    "long image": chat_prompt(image=["rgba.png"], text="Once upon a time " * 6),
}


@pytest.fixture(scope="module", params=sorted(QWEN35))
def kind(request) -> str:
    return request.param


def make(kind: str, **kw) -> LLM:
    return LLM(str(QWEN35[kind]), cpu_threads=1, **kw)


def _same(a, b) -> None:
    assert a.token_ids == b.token_ids
    assert a.logprobs == b.logprobs, max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True))


@torch.no_grad()
def test_greedy_equals_hf_generate_and_logprobs_a_teacher_forced_forward(kind):
    # catches: the DeltaNet state not carried from prefill into decode, M-RoPE positions after media wrong
    llm = make(kind)
    outs = llm.generate(list(PROMPTS.values()), SamplingParams(temperature=0.0, max_tokens=8, logprobs=0),
                        use_tqdm=False)
    ids = llm.engine.placeholder_ids
    pads = dict(image_pad_id=ids.image_pad_id, video_pad_id=ids.video_pad_id)
    worst = gap = 0.0
    for prompt, out in zip(PROMPTS.values(), outs, strict=True):
        req = llm.engine.prepare(prompt)
        gen = hf(kind).generate(**hf_inputs(req, [], **pads), max_new_tokens=8, do_sample=False, output_logits=True,
                                return_dict_in_generate=True, suppress_tokens=[ids.image_pad_id, ids.video_pad_id])
        got = out.outputs[0]
        assert got.token_ids == gen.sequences[0, len(req.prompt_token_ids):].tolist()
        ref = completion_logprobs(hf(kind)(**hf_inputs(req, got.token_ids, **pads)).logits, got.token_ids)
        worst = max(worst, (torch.tensor(got.logprobs) - ref).abs().max().item())
        stepped = torch.stack([torch.log_softmax(sc[0].float(), -1)[t] for sc, t in zip(gen.logits, got.token_ids,
                                                                                          strict=True)])
        gap = max(gap, (stepped - ref).abs().max().item())  # HF's own prefill + decode against its full forward
    print(f"\n{kind}: greedy ids = HF generate on {len(PROMPTS)} prompts; |logprobs - teacher-forced HF| max "
          f"{worst:.2e}; HF generate vs its full forward {gap:.2e}")
    assert worst < 1e-4, worst


def test_prefix_hit_and_group_fork_equal_cold_runs(kind):
    # catches: a hit resumed without the DeltaNet snapshot, a fork sharing one live state, a scan split only in
    # some runs
    prompt = PROMPTS["long image"]
    n4 = SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=5, logprobs=0)
    warm = make(kind, batch_invariant=True)
    group = warm.generate([prompt], n4, use_tqdm=False)[0]
    stats = warm.engine.stats()
    assert stats["state_restores"] == 3 and stats["prefix_hit_tokens"] > 0
    cold = make(kind, batch_invariant=True, enable_prefix_caching=False)
    for i, out in enumerate(group.outputs):
        alone = cold.generate([prompt], SamplingParams(temperature=1.0, seed=3 + i, max_tokens=5, logprobs=0),
                              use_tqdm=False)[0].outputs[0]
        _same(out, alone)


def test_preemption_recomputes_the_state(kind):
    prompts = [PROMPTS["text"], PROMPTS["image"], PROMPTS["long image"]]
    greedy = SamplingParams(temperature=0.0, max_tokens=20, logprobs=0)
    roomy = make(kind, num_kv_blocks=256).generate(prompts, greedy, use_tqdm=False)
    tight = make(kind, num_kv_blocks=9, max_num_batched_tokens=128)
    outs = tight.generate(prompts, greedy, use_tqdm=False)
    assert tight.engine.stats()["preemptions"] > 0
    for a, b in zip(roomy, outs, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    stats = tight.engine.stats()
    assert stats["state_live_free"] == stats["state_live_slots"]
    tight.engine.block_manager.check_invariants([])


def test_the_kernel_path_equals_the_torch_path(monkeypatch):
    # the CUDA path's segment kernels (conv + gated delta rule; the Triton interpreter here), a snapshot and its
    # restore included: catches a kernel state written to the wrong slot or a restore that reads zeros
    prompt = PROMPTS["long image"]
    params = SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=3, logprobs=0)
    want = make("qwen3_5").generate([prompt], params, use_tqdm=False)[0]
    monkeypatch.setenv("MM_INFER_KERNELS", "triton")
    llm = make("qwen3_5")
    got = llm.generate([prompt], params, use_tqdm=False)[0]
    assert llm.engine.stats()["state_restores"] == 1
    for x, y in zip(want.outputs, got.outputs, strict=True):
        assert x.token_ids == y.token_ids
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) <= 1e-4


def test_a_group_of_8_on_a_40_token_image_prompt_prefills_once_and_equals_8_requests(kind):
    # the target: vLLM's hybrid cache misses below 528 tokens (vllm#40696); ours hits at 32 of 40, state
    # included, and each sample equals the same request run alone and cold, bit for bit
    prompt = PROMPTS["40-token image"]
    llm = make(kind, batch_invariant=True)
    assert len(llm.engine.prepare(prompt).prompt_token_ids) == 40
    group = llm.generate([prompt], SamplingParams(n=8, temperature=1.0, seed=21, max_tokens=4, logprobs=0),
                         use_tqdm=False)[0]
    stats = llm.engine.stats()
    assert stats["prefix_hit_tokens"] == 7 * 32 and stats["prefix_query_tokens"] == 8 * 40
    assert stats["state_restores"] == 7
    cold = make(kind, batch_invariant=True, enable_prefix_caching=False)
    for i, out in enumerate(group.outputs):
        alone = cold.generate([prompt], SamplingParams(temperature=1.0, seed=21 + i, max_tokens=4, logprobs=0),
                              use_tqdm=False)[0].outputs[0]
        _same(out, alone)
