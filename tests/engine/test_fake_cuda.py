"""Device discipline on a CPU-only build: the engine's vision, LM, paged attention and sampler on fake cuda:0."""

from __future__ import annotations

import pytest
import torch
from engine_cases import CKPT, CKPT25, REPO, case
from fake_cuda import CUDA, HostSyncError, fake_cuda_engine

from mm_infer import SamplingParams
from mm_infer.engine.sampling import batch as sampling_batch

MOE = REPO / "assets" / "models" / "tiny-qwen3-vl-moe"
SAMPLING = [
    dict(temperature=0.0),
    dict(temperature=1.0, top_p=0.9, top_k=20, seed=3),
    dict(temperature=0.8, min_p=0.05, logprobs=3, logprobs_mode="processed_logprobs"),
    dict(temperature=1.0, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2, seed=1),
    dict(temperature=0.0, logit_bias={42: 5.0}, min_tokens=3, stop_token_ids=[7], logprobs=2),
]
PROMPTS = [
    case([6, ("image", 1, 4, 8), 10], seed=1),
    case([4, ("video", 4, 4, 4), 3, ("image", 1, 8, 4), 5], seed=2),
    {"prompt_token_ids": list(range(40, 75))},
    case([3, ("image", 1, 4, 4), 2], seed=3),
    {"prompt_token_ids": list(range(100, 120))},
]


def run_on_fake_cuda(model_dir, monkeypatch, steps: int = 3):
    """Prefill (with vision), then decode steps, every request through the sampler; returns the readbacks."""
    with fake_cuda_engine(model_dir, monkeypatch) as (engine, on_device, readbacks):
        requests = [engine.prepare(p) for p in PROMPTS]  # media preprocessing stays real, on the CPU
        with on_device():
            for i, (req, kw) in enumerate(zip(requests, SAMPLING, strict=True)):
                engine.add_request(f"r{i}", req, SamplingParams(max_tokens=8, ignore_eos=True, **kw))
            for _ in range(steps):
                engine.step()
        readbacks.static_buckets = sorted(engine.runner.graphs.buffers)  # decode steps took the static path
    return readbacks


@pytest.mark.parametrize("model_dir", [CKPT, CKPT25], ids=["qwen2-vl", "qwen2.5-vl"])
def test_prefill_vision_decode_and_sampling_stay_on_the_device(model_dir, monkeypatch):
    # catches: any cpu tensor meeting a cuda one (the CPU torch.Generator of every sampled row, CPU index tensors,
    # positions or slots left on the host) and any host read of device data before the readback
    readbacks = run_on_fake_cuda(model_dir, monkeypatch)
    assert len(readbacks.seen) == 3 and readbacks.static_buckets == [8]  # 5 rows padded to the bucket of 8
    first = readbacks.seen[0]
    assert len(first.batch.seqs) == len(PROMPTS)  # every request's whole prompt fits the first step
    for sampled in readbacks.seen:
        for t in (sampled.token_ids, sampled.logprobs, sampled.top_values, sampled.top_ids):
            assert t.device == CUDA
        assert sampled.top_values.shape == (len(PROMPTS), 3)


def test_a_planted_device_mix_fails_the_harness(monkeypatch):
    # the harness must be able to fail: per-row sampling values left on the CPU meet the cuda logits
    monkeypatch.setattr(sampling_batch.SamplingBatch, "tensor", lambda self, values, dtype: torch.tensor(values,
                                                                                                         dtype=dtype))
    with pytest.raises((RuntimeError, torch._subclasses.fake_tensor.FakeTensorDeviceMismatchError)):
        run_on_fake_cuda(CKPT, monkeypatch, steps=1)


def test_a_planted_host_read_fails_the_harness(monkeypatch):
    # the harness must be able to fail: a host sync in the forward (here, reading the hidden states' norm)
    from mm_infer.models.qwen_vl import QwenVLModel

    real = QwenVLModel.forward_hidden
    monkeypatch.setattr(QwenVLModel, "forward_hidden", lambda self, *a: (lambda h: (float(h.norm()), h)[1])(
        real(self, *a)))
    with pytest.raises(HostSyncError, match="read a"):
        run_on_fake_cuda(CKPT, monkeypatch, steps=1)


TEXT_PROMPTS = [{"prompt_token_ids": list(range(40 + 7 * i, 60 + 9 * i))} for i in range(5)]


def test_moe_prefill_and_decode_stay_on_the_device_without_host_syncs(monkeypatch):
    # catches: expert counts read back to the host in every MoE layer (bincount's output size, split's sizes); in
    # bfloat16, CUDA's grouped GEMM takes the group ends as a device tensor
    with fake_cuda_engine(MOE, monkeypatch, dtype="bfloat16") as (engine, on_device, readbacks):
        requests = [engine.prepare(p) for p in TEXT_PROMPTS]
        with on_device():
            for i, req in enumerate(requests):
                engine.add_request(f"m{i}", req, SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0))
            for _ in range(3):
                engine.step()
        assert len(readbacks.seen) == 3 and sorted(engine.runner.graphs.buffers) == [8]
