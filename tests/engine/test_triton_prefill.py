"""The paged prefill kernel in the engine (Triton interpreter here): the torch path's greedy tokens and logprobs
on images and videos, with prefix-cache hits and chunk boundaries inside an image."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from mm_infer import LLM, SamplingParams

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "assets" / "models"
CKPTS = {"qwen2": MODELS / "tiny-qwen2-vl", "qwen25": MODELS / "tiny-qwen2.5-vl"}
IMAGE = REPO / "assets" / "media" / "images" / "photo_q90.jpg"
VIDEO = REPO / "assets" / "media" / "videos" / "odd7_h264_2fps.mp4"
KW = {"max_pixels": 28 * 28 * 16, "video_max_pixels": 28 * 28 * 8}


def _chat(text: str, kind: str | None = None, media: Path | None = None) -> dict:
    content = ([{"type": kind}] if kind else []) + [{"type": "text", "text": text}]
    prompt = {"messages": [{"role": "user", "content": content}], "mm_processor_kwargs": KW}
    return prompt | ({"multi_modal_data": {kind: [media]}} if kind else {})


PROMPTS = [_chat("Describe it.", "image", IMAGE), _chat("What moves?", "video", VIDEO), _chat("Count to five.")]


def _run(ckpt: Path, prompts: list[dict]):
    # a small token budget splits prompts into chunks (boundaries inside the image); run twice: the second
    # pass hits the prefix cache, so its chunks attend to cached blocks they did not write
    llm = LLM(str(ckpt), num_kv_blocks=128, cpu_threads=1, max_num_batched_tokens=24)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
    first = llm.generate(prompts, params, use_tqdm=False)
    again = llm.generate(prompts, params, use_tqdm=False)
    return first + again


@pytest.mark.parametrize("kind", sorted(CKPTS))
def test_triton_prefill_gives_the_torch_tokens(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    if importlib.util.find_spec("triton") is None:  # find, not import: triton must load after TRITON_INTERPRET
        pytest.skip("triton is not installed")
    reference = _run(CKPTS[kind], PROMPTS)
    monkeypatch.setenv("MM_INFER_KERNELS", "triton")
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    got = _run(CKPTS[kind], PROMPTS)
    for a, b in zip(got, reference, strict=True):
        assert a.error is None, a.error.message
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert max(abs(x - y) for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True)) < 1e-4


def test_the_kernel_runs_for_chunks_only_on_triton_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    # catches: the engine building kernel tables on the torch path (host work for nothing), or never on Triton
    from mm_infer_kernels import dispatch

    calls: list[int] = []
    real = dispatch.paged_prefill

    def counting(*args, **kwargs):
        calls.append(args[0].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(dispatch, "paged_prefill", counting)
    llm = LLM(str(CKPTS["qwen2"]), num_kv_blocks=64, cpu_threads=1)
    llm.generate(PROMPTS[2], SamplingParams(max_tokens=2), use_tqdm=False)
    assert calls == []
    if importlib.util.find_spec("triton") is None:
        return
    monkeypatch.setenv("MM_INFER_KERNELS", "triton")
    if not torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    llm.generate(PROMPTS[2], SamplingParams(max_tokens=2), use_tqdm=False)
    layers = llm.engine.preparer.model_config.text.num_layers
    assert calls and len(calls) % layers == 0  # once per layer of each prefill step
