"""The runner ships uint8 frames to its device and embeds them there; on the CPU too, with the rows path's bits."""

from __future__ import annotations

from dataclasses import replace

import torch
from engine_cases import CKPT
from fake_cuda import CUDA, fake_cuda_engine

from mm_infer import LLM, SamplingParams
from mm_infer.media.frame_batch import FrameBatch
from mm_infer.models.qwen_vl import QwenVLModel

PROMPT = {"prompt": "<|vision_start|><|image_pad|><|vision_end|>What is it?",
          "multi_modal_data": {"image": [torch.randint(0, 256, (60, 90, 3), dtype=torch.uint8,
                                                       generator=torch.Generator().manual_seed(0)).numpy()]},
          "mm_processor_kwargs": {"max_pixels": 28 * 28 * 8}}


def spy(monkeypatch, name: str) -> list:
    calls: list = []
    real = getattr(QwenVLModel, name)
    monkeypatch.setattr(QwenVLModel, name, lambda self, *a: calls.append(a) or real(self, *a))
    return calls


def test_fake_cuda_runner_ships_uint8_frames_and_embeds_them_on_the_device(monkeypatch):
    frames, rows = spy(monkeypatch, "encode_frames"), spy(monkeypatch, "encode_vision")
    moved: list[torch.Tensor] = []
    real_to = FrameBatch.to
    monkeypatch.setattr(FrameBatch, "to", lambda self, *a, **k: moved.append(out := real_to(self, *a, **k)) or out)
    with fake_cuda_engine(CKPT, monkeypatch) as (engine, on_device, readbacks):
        req = engine.prepare(PROMPT)
        assert req.items[0].frames is not None
        with on_device():
            engine.add_request("r", req, SamplingParams(max_tokens=1))
            engine.step()
    assert len(frames) == 1 and not rows, "the device path takes frames, never float rows"
    (batch,) = moved
    assert batch.buffer.dtype == torch.uint8 and batch.buffer.device == CUDA
    assert batch.buffer.numel() == req.items[0].nbytes


def test_cpu_runner_embeds_frames_with_the_rows_paths_tokens(monkeypatch):
    """The CPU takes the frames path (table-lookup rows a group at a time, tests/models/test_vision_frames.py
    proves its bits); a prompt given as float rows takes the rows path, and both give the same logprobs."""
    frames, rows = spy(monkeypatch, "encode_frames"), spy(monkeypatch, "encode_vision")
    llm = LLM(str(CKPT))
    params = SamplingParams(max_tokens=4, logprobs=2, seed=7)
    by_frames = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    assert len(frames) == 1 and not rows
    req = llm.engine.prepare(PROMPT)
    as_rows = replace(req, items=[replace(it, media=it.pixel_values) for it in req.items])
    llm.engine.reset_caches()
    llm.engine.add_request("rows", as_rows, params.final_only())
    by_rows = llm._run(["rows"], use_tqdm=False)[0].outputs[0]
    assert len(rows) == 1
    assert by_rows.token_ids == by_frames.token_ids and by_rows.logprobs == by_frames.logprobs
