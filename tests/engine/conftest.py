"""Engine test fixtures: one engine per module on the tiny Qwen2-VL checkpoint (float32, CPU)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from engine_cases import CKPT

from mm_infer.llm import LLM


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    threads = torch.get_num_threads()
    yield LLM(str(CKPT), num_kv_blocks=2048, max_num_batched_tokens=4096, cpu_threads=1, batch_invariant=True)
    torch.set_num_threads(threads)  # one thread: far faster on a shared 2-core box; restored for other tests
