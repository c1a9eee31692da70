"""On a device the runner ships uint8 frames and embeds them there; on the CPU it keeps the exact rows path."""

from __future__ import annotations

import torch
from engine_cases import CKPT
from fake_cuda import CUDA, fake_cuda_engine

from mm_infer import LLM, SamplingParams
from mm_infer.media.frame_batch import FrameBatch
from mm_infer.models.qwen2_vl import QwenVLModel

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


def test_cpu_runner_keeps_the_rows_path(monkeypatch):
    frames, rows = spy(monkeypatch, "encode_frames"), spy(monkeypatch, "encode_vision")
    LLM(str(CKPT)).generate([PROMPT], SamplingParams(max_tokens=1))
    assert len(rows) == 1 and not frames
