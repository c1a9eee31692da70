"""The engine on tiny Nemotron Omni (hybrid Mamba-2 / attention / MoE), float32 CPU: greedy ids equal HF generate,
logprobs a teacher-forced HF forward, and the recurrent-state cache (prefix hits and n-sample forks from snapshots,
chunked prefill, abort, preemption, refit) exact."""

from __future__ import annotations

import pytest
import torch

from mm_infer import LLM, SamplingParams
from tests.engine.engine_cases import drain as _drain
from tests.models.nemotron_omni_cases import OMNI, hf, image_item, image_prompt, media_cases, request, text_ids

CASES = media_cases()
GEN = 10


def make(**kw) -> LLM:
    return LLM(str(OMNI), cpu_threads=1, **kw)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return make()


def _same(a, b) -> None:
    assert a.token_ids == b.token_ids
    assert a.logprobs == b.logprobs, max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True))


@torch.no_grad()
@pytest.mark.parametrize("case", list(CASES))
def test_greedy_equals_hf_generate_and_logprobs_a_teacher_forced_forward(llm, case):
    # catches: state not carried from prefill into decode, a decode step clamped like a prompt, media rows spliced
    # into the wrong <image> tokens, logprobs from the wrong row
    ids, media, items = CASES[case]
    out = llm.generate([request(ids, items)], SamplingParams(temperature=0.0, max_tokens=GEN, logprobs=0),
                       use_tqdm=False)[0].outputs[0]
    x = torch.tensor([ids])
    gen = hf().generate(x, **media, max_new_tokens=GEN, do_sample=False, output_scores=True,
                        return_dict_in_generate=True)
    want = gen.sequences[0, len(ids):].tolist()
    assert out.token_ids == want[:len(out.token_ids)] and len(out.token_ids) == GEN, (out.token_ids, want)
    full = hf()(input_ids=torch.tensor([ids + out.token_ids]), **media).logits[0].float()
    forced = torch.log_softmax(full[len(ids) - 1:-1], -1).gather(1, torch.tensor(out.token_ids)[:, None])[:, 0]
    stepped = torch.stack([torch.log_softmax(s[0].float(), -1)[t] for s, t in zip(gen.scores, want, strict=True)])
    ours = torch.tensor(out.logprobs)
    assert (ours - forced).abs().max().item() < 1e-4
    assert (ours - stepped).abs().max().item() < 1e-4
    print(f"\n{case}: |ours - forced| {(ours - forced).abs().max().item():.2e}, |ours - HF generate| "
          f"{(ours - stepped).abs().max().item():.2e}, |HF generate - forced| {(stepped - forced).abs().max():.2e}")


def _image_prompt(seed: int, length_text: int = 0):
    ids, patches = image_prompt([(4, 6)], seed=seed)
    return request(ids + text_ids(length_text, seed + 7), [image_item(patches, (4, 6), f"img-{seed}")])


def test_prefix_hit_equals_cold_bit_for_bit():
    # catches: a hit resumed without its snapshot (zero or another prompt's state), a snapshot taken at the wrong
    # position, a scan chunked differently after a hit than in a cold run
    prompt = _image_prompt(1, 30)  # 46 tokens: the hit is the first 32
    greedy = SamplingParams(temperature=0.0, max_tokens=8, logprobs=1)
    cold = make(batch_invariant=True, enable_prefix_caching=False).generate([prompt], greedy, use_tqdm=False)[0]
    warm = make(batch_invariant=True)
    first = warm.generate([prompt], greedy, use_tqdm=False)[0]
    before = warm.engine.stats()
    again = warm.generate([prompt], greedy, use_tqdm=False)[0]
    after = warm.engine.stats()
    assert after["prefix_hit_tokens"] - before["prefix_hit_tokens"] == (len(prompt.prompt_token_ids) - 1) // 16 * 16
    assert after["state_restores"] - before["state_restores"] == 1
    _same(first.outputs[0], cold.outputs[0])
    _same(again.outputs[0], cold.outputs[0])


def test_group_of_8_prefills_once_and_equals_8_separate_requests():
    # catches: siblings that miss the prompt (the hybrid prefix cache at 0% on short prompts, vllm#40696), a fork
    # that shares one live state between samples, a sample seeded or restored from the wrong slot
    prompt = _image_prompt(2, 44)  # 16 + 44 = 60 tokens
    n8 = SamplingParams(n=8, temperature=1.0, seed=11, max_tokens=6, logprobs=0)
    llm = make(batch_invariant=True)
    group = llm.generate([prompt], n8, use_tqdm=False)[0]
    stats = llm.engine.stats()
    shareable = (len(prompt.prompt_token_ids) - 1) // 16 * 16
    assert len(prompt.prompt_token_ids) == 60 and shareable == 48
    assert stats["prefix_hit_tokens"] == 7 * shareable and stats["prefix_query_tokens"] == 8 * 60
    assert stats["state_restores"] == 7 and stats["state_snapshots_taken"] == 1
    assert len({tuple(o.token_ids) for o in group.outputs}) > 1
    alone = make(batch_invariant=True, enable_prefix_caching=False)
    for i, out in enumerate(group.outputs):
        one = SamplingParams(temperature=1.0, seed=11 + i, max_tokens=6, logprobs=0)
        _same(out, alone.generate([prompt], one, use_tqdm=False)[0].outputs[0])


def test_chunked_prefill_carries_the_state_across_steps():
    # catches: a chunk restarting from zero or from a stale slot, the conv window lost between chunks
    prompts = [_image_prompt(3, 40), request(text_ids(70, 4))]
    greedy = SamplingParams(temperature=0.0, max_tokens=6, logprobs=0)
    whole = make(enable_prefix_caching=False).generate(prompts, greedy, use_tqdm=False)
    chunked = make(enable_prefix_caching=False, long_prefill_token_threshold=13,
                   max_num_batched_tokens=32).generate(prompts, greedy, use_tqdm=False)
    for a, b in zip(whole, chunked, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert max(abs(x - y) for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True)) <= 1e-5


def _slots_back(engine) -> None:
    stats = engine.stats()
    assert stats["state_live_free"] == stats["state_live_slots"], "a finished sequence kept its live state slot"
    engine.block_manager.check_invariants(engine.scheduler.live_sequences())


def test_preemption_and_abort_leave_no_state_behind():
    # catches: a preempted sequence resuming from its old slot (it recomputes from zero), slots leaked on abort
    prompts = [request(text_ids(20 + 9 * i, 40 + i)) for i in range(5)]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, logprobs=0)
    roomy = make(num_kv_blocks=256).generate(prompts, greedy, use_tqdm=False)
    tight = make(num_kv_blocks=9, max_num_batched_tokens=128)
    outs = tight.generate(prompts, greedy, use_tqdm=False)
    assert tight.engine.stats()["preemptions"] > 0
    for a, b in zip(roomy, outs, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
    _slots_back(tight.engine)
    engine = tight.engine
    for i in range(3):
        engine.add_request(f"r{i}", request(text_ids(25, 60 + i)), SamplingParams(n=2, temperature=1.0, seed=i,
                                                                                   max_tokens=30))
    for _ in range(4):
        engine.step()
        engine.block_manager.check_invariants(engine.scheduler.live_sequences())
    engine.abort("r1")
    while engine.has_unfinished():
        engine.step()
    _slots_back(engine)


def test_refit_and_cache_reset_drop_every_snapshot(llm):
    # catches: a snapshot of the old weights' state restored after a refit
    engine = llm.engine
    llm.generate([_image_prompt(5, 20)], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    assert engine.stats()["state_snapshots_held"] >= 1
    engine.reset_caches()
    assert engine.stats()["state_snapshots_held"] == 0
    assert len(engine.block_manager.states.free_snapshots) == engine.block_manager.states.snapshots
    before = engine.stats()["state_restores"]
    llm.generate([_image_prompt(5, 20)], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    assert engine.stats()["state_restores"] == before  # nothing to restore from: computed again


@pytest.mark.parametrize("after_tokens", [0, 3], ids=["fails-in-prefill", "fails-in-decode"])
def test_a_failed_step_advances_no_survivors_state(after_tokens):
    # catches: fault isolation's reruns writing states back, so a survivor's scan would advance twice
    engine = make(batch_invariant=True).engine
    greedy = SamplingParams(temperature=0.0, max_tokens=10, min_tokens=10)
    good = request(text_ids(27, 70))
    engine.add_request("solo", good, greedy)
    solo = _drain(engine)["solo"].outputs[0].token_ids
    real = engine.runner.run

    def run(chunks):
        if any(c.seq.group.request_id == "bad" and c.seq.num_output_tokens >= after_tokens for c in chunks):
            raise RuntimeError("injected fault")
        return real(chunks)

    engine.runner.run = run
    engine.add_request("good", good, greedy)
    engine.step()
    engine.add_request("bad", request(text_ids(19, 71)), greedy)
    finals = _drain(engine)
    assert finals["bad"].error is not None
    assert finals["good"].outputs[0].token_ids == solo and finals["good"].error is None
    _slots_back(engine)


@torch.no_grad()
def test_refits_in_memory_and_from_disk_follow_hf(tmp_path):
    # catches: Mamba parameters (A_log, dt_bias, conv1d, D) or per-expert tensors skipped or misplaced by a refit,
    # a state snapshot of the old weights restored after it
    import shutil

    from safetensors.torch import load_file, save_file

    ids, media, items = CASES["one image"]
    greedy = SamplingParams(temperature=0.0, max_tokens=6, logprobs=0)
    llm = make()
    before = llm.generate([request(ids, items)], greedy, use_tqdm=False)[0]  # caches of the old weights
    stored = load_file(str(OMNI / "model.safetensors"))
    gen = torch.Generator().manual_seed(9)
    moved = {k: v + 0.05 * torch.randn(v.shape, generator=gen) if v.is_floating_point() and "mtp" not in k else v
             for k, v in stored.items()}
    ckpt = tmp_path / "refit"
    shutil.copytree(OMNI, ckpt)
    save_file(moved, str(ckpt / "model.safetensors"))
    from transformers import AutoModelForImageTextToText

    ref = AutoModelForImageTextToText.from_pretrained(ckpt, dtype=torch.float32).eval()
    want = ref.generate(torch.tensor([ids]), **media, max_new_tokens=6, do_sample=False)[0, len(ids):].tolist()
    assert want != before.outputs[0].token_ids, "the perturbation must change the answer"
    llm.update_weights_from_disk(str(ckpt))
    assert llm.generate([request(ids, items)], greedy, use_tqdm=False)[0].outputs[0].token_ids == want
    llm.update_weights_from_disk(str(OMNI))
    llm.update_weights(list(ref.state_dict().items()))  # transformers' names: stacked experts, split q/k/v
    assert llm.generate([request(ids, items)], greedy, use_tqdm=False)[0].outputs[0].token_ids == want


def test_the_kernel_path_equals_the_torch_path(monkeypatch):
    # the CUDA path's segment kernels (Triton; the interpreter here), snapshots and restores included: catches a
    # kernel state written to the wrong slot, a snapshot of the wrong step, a restore that reads zeros
    ids, _, items = CASES["video"]
    prompts = [request(ids, items), _image_prompt(8, 30)]
    params = SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=3, logprobs=0)
    want = make().generate(prompts, params, use_tqdm=False)
    monkeypatch.setenv("MM_INFER_KERNELS", "triton")
    llm = make()
    got = llm.generate(prompts, params, use_tqdm=False)
    assert llm.engine.stats()["state_restores"] >= 1  # the 46-token prompt's second sample restored a snapshot
    for a, b in zip(want, got, strict=True):
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert x.token_ids == y.token_ids
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) <= 1e-4


def test_batch_invariant_alone_equals_inside_a_mixed_batch():
    # catches: decode steps batched (a row's reductions seeing the batch), MoE experts not padded, vision items
    # batched with others. (Budgets that split prompts differently are not covered: attention itself is not
    # invariant to where a prompt is chunked, for every family; the scan's grid is tested alone below.)
    prompts = [request(ids, items) for ids, _, items in CASES.values()] + [_image_prompt(11, 50),
                                                                           request(text_ids(61, 12))]
    params = [SamplingParams(temperature=0.0, max_tokens=5, logprobs=1) if i % 2 else
              SamplingParams(temperature=1.0, seed=30 + i, max_tokens=5, logprobs=1) for i in range(len(prompts))]
    llm = make(batch_invariant=True, enable_prefix_caching=False, encoder_cache_items=1)
    batched = llm.generate(prompts, params, use_tqdm=False)
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        alone = llm.generate([prompt], p, use_tqdm=False)[0]
        _same(alone.outputs[0], batched[i].outputs[0])


def test_the_scan_split_on_its_grid_equals_the_whole_bit_for_bit():
    # why the scheduler cuts hybrid prompts on the grid: on it a split prompt equals the whole bit for bit, off it
    # (where a step's budget ran out) it does not
    from mm_infer.models.mamba2 import chunked_scan

    g = torch.Generator().manual_seed(3)
    x = torch.randn(45, 4, 8, generator=g)
    b, c = torch.randn(45, 4, 16, generator=g), torch.randn(45, 4, 16, generator=g)
    dt, a = torch.rand(45, 4, generator=g) * 0.5, -torch.rand(4, generator=g)
    start = torch.randn(4, 8, 16, generator=g)
    whole, end = chunked_scan(x, dt, a, b, c, start, 8)
    y1, mid = chunked_scan(x[:16], dt[:16], a, b[:16], c[:16], start, 8)
    y2, end2 = chunked_scan(x[16:], dt[16:], a, b[16:], c[16:], mid, 8)
    assert torch.equal(torch.cat([y1, y2]), whole) and torch.equal(end, end2)
    y1, mid = chunked_scan(x[:13], dt[:13], a, b[:13], c[:13], start, 8)
    y2, _ = chunked_scan(x[13:], dt[13:], a, b[13:], c[13:], mid, 8)
    assert not torch.equal(torch.cat([y1, y2]), whole)


def test_the_scheduler_cuts_hybrid_prompts_on_the_scan_grid():
    # catches: a chunk ending where the budget ran out (its scan would differ from the same prompt whole)
    from mm_infer.engine.scheduling.scheduler import Scheduler

    llm = make(batch_invariant=True)
    sched: Scheduler = llm.engine.scheduler
    assert sched.scan_chunk == 8

    class Seq:  # a 70-token prompt with a media item ending in block 2 (boundary 32) and the prompt's (64)
        num_computed_tokens, num_prompt_tokens = 0, 70

        def state_boundaries(self, bs: int) -> tuple[int, ...]:
            return (32, 64)

    seq = Seq()
    assert sched._on_scan_grid(seq, 27) == 24  # 0 + 3 chunks of 8
    seq.num_computed_tokens = 24
    assert sched._on_scan_grid(seq, 45) == 8  # stops at the boundary 32, where the scan restarts
    seq.num_computed_tokens = 32
    assert sched._on_scan_grid(seq, 30) == 24  # 32 + 3 chunks of 8
    seq.num_computed_tokens = 56
    assert sched._on_scan_grid(seq, 12) == 8  # to the boundary 64
    seq.num_computed_tokens = 0
    assert sched._on_scan_grid(seq, 5) == 5  # less than one grid step: as given, never stalled
    assert sched._on_scan_grid(seq, 70) == 70  # the whole prompt


def test_a_request_sharing_only_the_image_hits_at_the_media_boundary():
    # catches: no snapshot where a media item ends (requests with one image and other questions recompute it all),
    # a media boundary the cold run does not split at (the hit would not equal it)
    ids, patches = image_prompt([(8, 8)], seed=21)  # text 5, <img> 16 x <image> </img> (ends at 23), text 3
    item = image_item(patches, (8, 8), "img-shared")
    first, second = request(ids + text_ids(30, 22), [item]), request(ids + text_ids(25, 23), [item])
    greedy = SamplingParams(temperature=0.0, max_tokens=6, logprobs=1)
    warm = make(batch_invariant=True)
    warm.generate([first], greedy, use_tqdm=False)
    before = warm.engine.stats()
    got = warm.generate([second], greedy, use_tqdm=False)[0].outputs[0]
    after = warm.engine.stats()
    assert after["prefix_hit_tokens"] - before["prefix_hit_tokens"] == 16  # the last full block before 23
    assert after["state_restores"] - before["state_restores"] == 1
    cold = make(batch_invariant=True, enable_prefix_caching=False).generate([second], greedy, use_tqdm=False)[0]
    _same(got, cold.outputs[0])
