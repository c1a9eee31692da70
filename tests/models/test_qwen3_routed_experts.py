"""R3 on tiny Qwen3-VL-MoE: every token's routed experts at every layer equal HF's router over prompt + completion,
and a prefix hit, a sibling sample and a preempted sample return what a cold run computes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from model_cases import REPO
from PIL import Image
from qwen3_cases import QWEN3, hf

from mm_infer import LLM, SamplingParams
from mm_infer.prompt.placeholders import PromptError
from mm_infer.prompt.request import VLMRequest

KIND = "qwen3_vl_moe"
IMAGE = REPO / "assets" / "media" / "images" / "photo.png"
TEXT = {"messages": [{"role": "user", "content": [{"type": "text", "text": "def f(x): return x"}]}]}
WITH_IMAGE = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe it."}]}],
              "multi_modal_data": {"image": [Image.open(IMAGE).convert("RGB")]},
              "mm_processor_kwargs": {"backend": "pil"}}
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


@pytest.fixture(scope="module")
def llm():
    threads = torch.get_num_threads()
    yield LLM(str(QWEN3[KIND]), enable_return_routed_experts=True, batch_invariant=True, num_kv_blocks=256,
              max_num_batched_tokens=4096, cpu_threads=1)
    torch.set_num_threads(threads)


@torch.inference_mode()
def hf_routing(llm: LLM, req: VLMRequest, completion: list[int], model: torch.nn.Module | None = None) -> np.ndarray:
    """HF's router choices [P + G, layers, k] over prompt + completion in one teacher-forced forward (dense layers'
    columns 0, as vLLM leaves them)."""
    from mm_infer.rl import hf_inputs

    model, ids = model or hf(KIND), llm.engine.placeholder_ids
    cfg = llm.engine.preparer.model_config.text
    kw = hf_inputs(req, completion, image_pad_id=ids.image_pad_id, video_pad_id=ids.video_pad_id)
    out = np.zeros((kw["input_ids"].shape[1], cfg.num_layers, cfg.moe.top_k), dtype=np.uint8)
    hooks = []
    for i, layer in enumerate(model.model.language_model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and not isinstance(gate, torch.nn.Linear):  # the sparse blocks' routers
            def keep(_m, _inp, res, i=i):
                out[:, i] = res[2].numpy()
            hooks.append(gate.register_forward_hook(keep))
    try:
        model(**kw)
    finally:
        for h in hooks:
            h.remove()
    return out


@pytest.mark.parametrize("prompt", [TEXT, WITH_IMAGE], ids=["text", "image"])
def test_routing_equals_hf_router_over_prompt_and_completion(llm, prompt):
    # catches: rows shifted by one token, the completion's decode rows missing, a layer written into the wrong
    # column, padding rows of the batch-invariant GEMMs returned, or the wrong dtype
    out = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    got = out.outputs[0].routed_experts
    req = llm.engine.prepare(prompt)
    p, g = len(out.prompt_token_ids), len(out.outputs[0].token_ids)
    assert got is not None and got.shape == (p + g - 1, 3, 2) and got.dtype == np.uint8
    want = hf_routing(llm, req, out.outputs[0].token_ids)
    assert np.array_equal(got, want[:p + g - 1])
    assert not got[:, 1].any(), "layer 1 is dense (mlp_only_layers): vLLM leaves its column 0"
    assert len(np.unique(got[:, [0, 2]])) >= 6, "the prompt must exercise most of the 8 experts"


def test_a_prefix_hit_and_sibling_samples_return_the_cold_routing(llm):
    # catches: the cached prompt tokens' rows missing or zero after a prefix hit, rows of another block, a
    # sibling sample's prompt rows differing from its group's, or a batch's rows handed to the wrong sample
    prompt = {"messages": [{"role": "user", "content": [{"type": "text", "text": "List five prime numbers " * 4}]}]}
    llm.engine.block_manager.reset_prefix_cache()
    cold = llm.generate([prompt], GREEDY, use_tqdm=False)[0]
    sampled = SamplingParams(temperature=1.0, seed=3, max_tokens=5, n=3)
    warm = llm.generate([prompt], sampled, use_tqdm=False)[0]
    p = len(cold.prompt_token_ids)
    assert warm.num_cached_tokens >= 32, "the second request must hit the first one's blocks"
    assert len({tuple(c.token_ids) for c in warm.outputs}) == 3, "the samples must differ (they decode together)"
    req = llm.engine.prepare(prompt)
    for c in warm.outputs:
        assert c.routed_experts.shape == (p + len(c.token_ids) - 1, 3, 2)
        assert np.array_equal(c.routed_experts[:p], cold.outputs[0].routed_experts[:p])
        assert np.array_equal(c.routed_experts, hf_routing(llm, req, c.token_ids)[:-1]), "its own decode rows"


def test_prompt_start_skips_rows_and_is_checked(llm):
    # catches: routed_experts_prompt_start ignored or applied to the completion, and an out-of-range start taken
    full = llm.generate([TEXT], GREEDY, use_tqdm=False)[0]
    p = len(full.prompt_token_ids)
    for start in (3, p):
        part = llm.generate([TEXT], SamplingParams(temperature=0.0, max_tokens=6, routed_experts_prompt_start=start),
                            use_tqdm=False)[0]
        assert np.array_equal(part.outputs[0].routed_experts, full.outputs[0].routed_experts[start:])
    with pytest.raises(PromptError, match="routed_experts_prompt_start must be between 0 and the prompt length"):
        llm.engine.add_request("too-far", TEXT, SamplingParams(routed_experts_prompt_start=p + 1))
    with pytest.raises(ValueError, match="routed_experts_prompt_start must be >= 0"):
        SamplingParams(routed_experts_prompt_start=-1)


def test_preempted_samples_return_the_routing_of_an_uninterrupted_run(llm):
    # catches: rows of the first attempt kept after a preemption's recompute (or lost with its blocks)
    words = ["river", "stone", "lantern", "harbor", "meadow", "engine", "violet", "cobalt", "thunder", "pepper"]
    texts = [" ".join(words[(i * 3 + j * 7) % len(words)] for j in range(20)) for i in range(6)]  # unlike each other
    prompts = [{"messages": [{"role": "user", "content": [{"type": "text", "text": t}]}]} for t in texts]
    params = SamplingParams(temperature=0.0, max_tokens=40)  # ~70 + 40 tokens: 7-8 blocks each, 12 in the pool
    alone = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
    tight = LLM(str(QWEN3[KIND]), enable_return_routed_experts=True, batch_invariant=True, num_kv_blocks=12,
                max_num_batched_tokens=4096, cpu_threads=1, enable_prefix_caching=False)
    together = tight.generate(prompts, params, use_tqdm=False)
    assert tight.engine.scheduler.num_preemptions > 0, "the pool must be too small for all six at once"
    for a, b in zip(alone, together, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert np.array_equal(a.outputs[0].routed_experts, b.outputs[0].routed_experts)


def test_a_model_without_moe_layers_is_refused():
    with pytest.raises(ValueError, match="needs a Qwen3-VL MoE model; tiny-qwen3-vl has no MoE layer"):
        LLM(str(QWEN3["qwen3_vl"]), enable_return_routed_experts=True, num_kv_blocks=16)


def test_a_hybrid_model_is_refused_by_name():
    # catches: R3 silently returning nothing for Nemotron-H's MoE layers (not recorded yet)
    from tests.models.nemotron_omni_cases import OMNI

    with pytest.raises(ValueError, match="not built for hybrid"):
        LLM(str(OMNI), enable_return_routed_experts=True, num_kv_blocks=16)


def test_static_decode_records_routing_too(llm):
    # catches: the static decode path (decode graphs on CUDA; off under CPU batch invariance, so the tests above
    # never take it) not writing the capture buffer, or its padded rows returned
    fast = LLM(str(QWEN3[KIND]), enable_return_routed_experts=True, num_kv_blocks=64, cpu_threads=1)
    assert fast.engine.runner.graphs is not None
    outs = fast.generate([TEXT, WITH_IMAGE], GREEDY, use_tqdm=False)  # two rows decode together
    for prompt, out in zip([TEXT, WITH_IMAGE], outs, strict=True):
        c = out.outputs[0]
        want = hf_routing(fast, fast.engine.prepare(prompt), c.token_ids)
        assert np.array_equal(c.routed_experts, want[:len(out.prompt_token_ids) + len(c.token_ids) - 1])


def test_off_by_default(llm):
    plain = LLM(str(QWEN3[KIND]), num_kv_blocks=32, cpu_threads=1)
    assert plain.generate([TEXT], GREEDY, use_tqdm=False)[0].outputs[0].routed_experts is None
    assert plain.engine.runner.routing is None


def test_rollouts_carry_each_samples_routing(llm):
    # catches: the RL rollout helper dropping the routing a trainer replays
    from mm_infer.rl.rollout import RolloutRow, generate_rollouts

    groups = generate_rollouts(llm.engine, [RolloutRow(TEXT)], lambda text, truth: 0.0,
                               SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=4))
    p = len(groups[0].prompt_token_ids)
    for s in groups[0].samples:
        assert s.routed_experts is not None and s.routed_experts.shape == (p + len(s.token_ids) - 1, 3, 2)


@torch.no_grad()
def test_a_trainer_forward_replaying_the_rollouts_routing_gives_its_logprobs(llm):
    # catches: the replay helper forcing the wrong rows or layers, or its weights not the router's at the forced
    # experts; after a refit that moves the router, a trainer still holding the old router routes elsewhere
    # unless it replays (R3's point), and with the replay its logprobs are the rollout's
    from transformers import AutoModelForImageTextToText

    from mm_infer.rl import completion_logprobs, hf_inputs, replayed_routing
    from mm_infer.rl.rollout import RolloutRow, generate_rollouts

    # a trainer of its own: the cached oracle may hold inference tensors (loaded under inference_mode elsewhere)
    model = AutoModelForImageTextToText.from_pretrained(QWEN3[KIND], dtype=torch.float32).eval()
    ids = llm.engine.placeholder_ids
    old = {k: v.clone() for k, v in model.state_dict().items()}
    moved = {k: v + 0.5 * torch.randn(v.shape, generator=torch.Generator().manual_seed(9))
             for k, v in old.items() if k.endswith("mlp.gate.weight")}  # the refit moves every router
    try:
        llm.update_weights(list(moved.items()))
        group = generate_rollouts(llm.engine, [RolloutRow(WITH_IMAGE)], lambda text, truth: 0.0,
                                  SamplingParams(n=2, temperature=1.0, seed=4, max_tokens=6))[0]
        for s in group.samples:
            kw = hf_inputs(group.request, s.token_ids, image_pad_id=ids.image_pad_id, video_pad_id=ids.video_pad_id)
            stale = hf_routing(llm, group.request, s.token_ids, model)  # the trainer before it takes the new weights
            assert not np.array_equal(stale[:-1], s.routed_experts), "the refit must move the routing"
            with replayed_routing(model, s.routed_experts):
                forced = hf_routing(llm, group.request, s.token_ids, model)
            assert np.array_equal(forced[:-1], s.routed_experts)
            model.load_state_dict({**old, **moved})  # the trainer with the rollout's weights
            with replayed_routing(model, s.routed_experts):
                lp = completion_logprobs(model(**kw).logits, s.token_ids)
            model.load_state_dict(old)
            assert (lp - torch.tensor(s.logprobs)).abs().max().item() <= 1e-5
    finally:
        model.load_state_dict(old)
        llm.update_weights(list({k: old[k] for k in moved}.items()))
