"""Memory sizing: size strings, the KV pool from bytes or a profiled CUDA budget, max_model_len never silently cut."""

from __future__ import annotations

import logging

import pytest
import torch
from engine_cases import CKPT
from fake_cuda import fake_cuda_engine

from mm_infer import LLM
from mm_infer.engine.runner.memory_profile import MemorySnapshot
from mm_infer.engine.runner.model_runner import ModelRunner
from mm_infer.engine.scheduling.encoder_cache import EncoderCache
from mm_infer.sizes import parse_size

GIB = 2**30


@pytest.mark.parametrize("text, size", [("4GiB", 4 * GIB), ("512MiB", 512 * 2**20), ("1.5G", 1_500_000_000),
                                        ("2e9", 2_000_000_000), ("16kb", 16_000), (" 7 ", 7), (4096, 4096)])
def test_sizes_parse(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["x", "-1", "1.5", "GiB", "4 GiBs", True])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def per_block(llm: LLM) -> int:
    return ModelRunner.kv_bytes_per_block(llm.engine.model, 16)


def test_pool_from_a_byte_string_and_context_lowered_aloud(caplog):
    with caplog.at_level(logging.WARNING):
        llm = LLM(str(CKPT), kv_cache_memory_bytes="1MiB", cpu_threads=1)
    blocks = 2**20 // per_block(llm)
    assert llm.engine.runtime.num_kv_blocks == blocks
    assert llm.engine.runtime.max_model_len == blocks * 16  # the model allows more: lowered, and said so
    assert "lowered from the model's" in caplog.text and f"holds {blocks} blocks" in caplog.text


def test_an_explicit_context_the_pool_cannot_hold_fails_with_the_numbers():
    # catches: the old silent clamp of max_model_len to the pool
    with pytest.raises(ValueError, match=r"max_model_len 4096 needs 256 KV blocks .* the pool has 64"):
        LLM(str(CKPT), num_kv_blocks=64, max_model_len=4096)
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        LLM(str(CKPT), num_kv_blocks=64, max_model_len=10**7)


def test_encoder_cache_is_bounded_in_bytes():
    cache = EncoderCache(max_items=100, max_bytes=3 * 400)
    for i in range(5):
        cache.put(f"h{i}", torch.zeros(10, 10))  # 400 bytes each
    assert len(cache) == 3 and cache.bytes == 1200 and "h0" not in cache and "h4" in cache
    cache.put("huge", torch.zeros(100, 10))  # larger than the whole cache: not kept, nothing evicted
    assert "huge" not in cache and len(cache) == 3
    cache.clear()
    assert cache.bytes == 0


def test_budget_arithmetic():
    snap = MemorySnapshot(total=100 * GIB, used_before=20 * GIB, allocated_before=15 * GIB, peak_allocated=18 * GIB)
    assert snap.kv_budget(0.9, GIB) == 90 * GIB - 20 * GIB - 3 * GIB - GIB


def fake_cuda_memory(monkeypatch, total: int, free: int, peak: int, allocated: int) -> None:
    for name, value in (("mem_get_info", lambda d=None: (free, total)), ("memory_allocated", lambda d=None: allocated),
                        ("max_memory_allocated", lambda d=None: peak), ("empty_cache", lambda: None),
                        ("reset_peak_memory_stats", lambda d=None: None), ("synchronize", lambda d=None: None)):
        monkeypatch.setattr(torch.cuda, name, value)


def test_cuda_pool_is_what_utilization_leaves_after_a_profiled_step(monkeypatch):
    # the profile step itself (vision budget, token budget, sampler temporaries) runs on fake cuda: device-clean
    fake_cuda_memory(monkeypatch, total=80 * GIB, free=70 * GIB, peak=12 * GIB, allocated=10 * GIB)
    with fake_cuda_engine(CKPT, monkeypatch, num_kv_blocks=None, encoder_cache_bytes="1GiB") as (engine, _, _):
        blocks = engine.runtime.num_kv_blocks
        per = ModelRunner.kv_bytes_per_block(engine.model, 16)
    assert blocks == (int(80 * GIB * 0.9) - 10 * GIB - 2 * GIB - GIB) // per


def test_cuda_without_room_fails_at_startup_with_the_numbers(monkeypatch):
    fake_cuda_memory(monkeypatch, total=8 * GIB, free=1 * GIB, peak=GIB, allocated=GIB // 2)
    with pytest.raises(ValueError, match="no room for the KV cache: gpu_memory_utilization 0.9 of 8.00 GiB"):
        with fake_cuda_engine(CKPT, monkeypatch, num_kv_blocks=None):
            pass
