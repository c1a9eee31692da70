"""Nemotron-H's hybrid LM (Mamba-2, attention, MoE, MLP) against HF's NemotronHForCausalLM in float32: whole
prompts, packed sequences, chunked prefill and the decode recurrence continuing from the recurrent state."""

from __future__ import annotations

import pytest
import torch

from mm_infer.models.nemotron_h import NemotronHConfig, NemotronHModel, our_name
from mm_infer.models.recurrent_batch import RecurrentBatch, StateSegment

TOL = 1e-4
TEXT = {"model_type": "nemotron_h", "vocab_size": 128, "hidden_size": 64, "hybrid_override_pattern": "M*EM-E",
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
        "mlp_hidden_act": "relu2", "mamba_num_heads": 8, "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 2,
        "conv_kernel": 4, "chunk_size": 8, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "moe_shared_expert_intermediate_size": 48, "n_group": 2, "topk_group": 1,
        "norm_topk_prob": True, "routed_scaling_factor": 2.5, "layer_norm_epsilon": 1e-5, "time_step_min": 0.001,
        "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


@pytest.fixture(scope="module")
def pair():
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TEXT)).float().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # HF's init leaves norms, D and the router bias at constants: move them off
        for name, p in hf.named_parameters():
            if name.endswith(("norm.weight", ".D", "dt_bias", "conv1d.bias", "norm_f.weight")):
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=gen) * 2.0)
        for name, b in hf.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn(b.shape, generator=gen))
    ours = NemotronHModel(NemotronHConfig.from_hf(TEXT)).float().eval()
    state = {our_name(k): v for k, v in hf.state_dict().items()}
    missing, unexpected = ours.load_state_dict(state, strict=True), None
    assert unexpected is None and not missing.missing_keys
    return hf, ours


def ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 128, (n,), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def hf_logits(hf, tokens: torch.Tensor) -> torch.Tensor:
    return hf(input_ids=tokens[None]).logits[0].float()


def test_the_layer_pattern_is_hfs(pair):
    hf, ours = pair
    assert [b.kind for b in ours.layers] == ["mamba", "attention", "moe", "mamba", "mlp", "moe"]
    assert list(hf.config.layers_block_type) == ["linear_attention", "full_attention", "moe", "linear_attention",
                                                 "mlp", "moe"]


@pytest.mark.parametrize("length", [1, 7, 8, 21, 40])
@torch.no_grad()
def test_whole_prompt_logits_equal_hf(pair, length):
    # catches: a wrong in_proj split, conv padding, chunk boundary, gated-norm order, router, or dt clamp
    hf, ours = pair
    tokens = ids(length, length)
    diff = (ours(tokens) - hf_logits(hf, tokens)).abs().max().item()
    assert diff <= TOL, diff


@torch.no_grad()
def test_packed_sequences_equal_each_alone(pair):
    # catches: a Mamba state or conv window running across two sequences of one batch
    _, ours = pair
    a, b = ids(13, 1), ids(9, 2)
    packed = ours(torch.cat([a, b]), [13, 9])
    assert torch.allclose(packed[:13], ours(a), atol=1e-5) and torch.allclose(packed[13:], ours(b), atol=1e-5)


@torch.no_grad()
def test_chunked_prefill_and_decode_continue_from_the_state(pair):
    # catches: a state not carried between chunks, a conv window restarted, or the decode step's dt clamp
    hf, ours = pair
    tokens = ids(30, 3)
    want = hf_logits(hf, tokens)
    pool = ours.state_pool(1)
    got = []
    for lo, hi in ((0, 9), (9, 20), *((t, t + 1) for t in range(20, 30))):  # two prefill chunks, then one by one
        part = tokens[lo:hi]
        states = RecurrentBatch(pool, [StateSegment(0, lo, hi - lo, 20, None if lo == 0 else 0, 0)])
        hidden = ours.forward_hidden(ours.embeddings(part), _KVContext(ours, hi - lo), states)
        states.commit()
        got.append(ours.compute_logits(hidden))
    diff = (torch.cat(got) - want).abs().max().item()
    assert diff <= TOL, diff


class _KVContext:
    """A dense KV cache for one sequence across calls (what the engine's paged cache does), for the test above."""

    def __init__(self, model, n: int, store: dict | None = None) -> None:
        self.store = _STORE.setdefault(id(model), {}) if store is None else store
        self.n = n

    def attend(self, layer_idx, q, k, v):
        from mm_infer.models.attention import causal_attention_batch

        past_k, past_v = self.store.get(layer_idx, (k[:0], v[:0]))
        keys, values = torch.cat([past_k, k]), torch.cat([past_v, v])
        self.store[layer_idx] = (keys, values)
        ctx = keys.shape[0]
        # queries are the last n of ctx positions: pad them in front so the causal mask lines up
        qpad = torch.cat([q.new_zeros(ctx - self.n, *q.shape[1:]), q])
        return causal_attention_batch(qpad[None], keys[None], values[None])[0][-self.n:]


_STORE: dict = {}


@torch.no_grad()
def test_a_prompt_clamps_small_time_steps_and_a_decode_step_does_not(pair):
    # catches: dt clamped in decode, or not in prefill (HF's torch path does the one and not the other)
    import copy

    hf, ours = pair
    hf_layer, our_layer = copy.deepcopy(hf.model.layers[0].mixer), copy.deepcopy(ours.layers[0].mixer)
    for m in (hf_layer, our_layer):
        m.dt_bias[:4] = -9.0  # softplus(-9) ~ 1.2e-4, under time_step_min
    x = torch.randn(1, 12, 64, generator=torch.Generator().manual_seed(4))
    want = hf_layer(x)[0]
    fresh = lambda: ours.state_pool(1).read(0, None)  # noqa: E731
    got = our_layer(x[0], fresh())
    assert (got - want).abs().max().item() <= 1e-5
    step = our_layer(x[0, :1], fresh(), decode=True)  # a decode step: the recurrence, unclamped
    assert (step - want[:1]).abs().max().item() > 2e-6, "a lone token must not be clamped (fp32 noise: ~1e-7)"
