"""Start-up facts of an engine: its device and dtype, KV pool size, context length and special token ids."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from mm_infer.config import CPU_KV_CACHE_BYTES, EngineConfig, EngineRuntime, SpecialTokens
from mm_infer.models.config import ModelConfig
from mm_infer.prompt.placeholders import PlaceholderIds
from mm_infer.sizes import format_size

log = logging.getLogger(__name__)


def pick_device(device: str) -> torch.device:
    """The engine's device, with an index on CUDA ("cuda" -> "cuda:<current>"), so every tensor names one device."""
    dev = torch.device(device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    names = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16, "half": torch.float16,
             "bfloat16": torch.bfloat16}
    if dtype not in names:
        raise ValueError(f"dtype must be auto or one of {sorted(names)}, got {dtype!r}")
    return names[dtype]


def _max_positions(model_dir: Path) -> int:
    raw = json.loads((model_dir / "config.json").read_text())
    return int((raw.get("text_config") or {}).get("max_position_embeddings") or raw.get("max_position_embeddings")
               or 32768)


def _eos_ids(model_dir: Path, config_eos: int | tuple[int, ...] | None) -> tuple[int, ...]:
    ids = list(config_eos if isinstance(config_eos, tuple) else [] if config_eos is None else [config_eos])
    gen = model_dir / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids += eos if isinstance(eos, list) else [] if eos is None else [eos]
    return tuple(dict.fromkeys(int(i) for i in ids))


def kv_pool_blocks(config: EngineConfig, device: torch.device, bytes_per_block: int,
                   cuda_budget: Callable[[], int], state_bytes: int = 0) -> int:
    """Blocks of the KV pool: the explicit count, the explicit bytes, the profiled CUDA budget or the CPU default.
    A hybrid model's recurrent-state pool (state_bytes) comes out of the same bytes first, as vLLM counts it."""
    cache = config.cache
    if cache.num_kv_blocks:
        return cache.num_kv_blocks
    if cache.kv_cache_memory_bytes is not None:
        budget = int(cache.kv_cache_memory_bytes)
    elif device.type == "cuda":
        budget = cuda_budget()
    else:
        budget = CPU_KV_CACHE_BYTES
    if state_bytes and budget - state_bytes < bytes_per_block:
        raise ValueError(f"the KV cache budget {format_size(budget)} does not hold the recurrent-state pool "
                         f"({format_size(state_bytes)}) and one KV block; raise kv_cache_memory_bytes / "
                         "gpu_memory_utilization, or lower max_num_seqs / state_snapshots")
    return max((budget - state_bytes) // bytes_per_block, 1)


def context_length(config: EngineConfig, model_max: int, num_blocks: int, bytes_per_block: int) -> int:
    """max_model_len: the asked length (an error if the pool or the model cannot hold it), else the model's,
    lowered (and said so) when the pool holds less."""
    block_size = config.cache.block_size
    pool = num_blocks * block_size
    asked = config.scheduler.max_model_len
    if asked is not None:
        if asked > model_max:
            raise ValueError(f"max_model_len {asked} exceeds the model's max_position_embeddings {model_max}")
        if asked > pool:
            need = -(-asked // block_size)
            raise ValueError(f"max_model_len {asked} needs {need} KV blocks ({format_size(need * bytes_per_block)}) "
                             f"for one sequence; the pool has {num_blocks} ({format_size(num_blocks * bytes_per_block)}"
                             "). Raise kv_cache_memory_bytes / gpu_memory_utilization or lower max_model_len")
        return asked
    if model_max > pool:
        log.warning("max_model_len lowered from the model's %d to %d tokens: the KV pool holds %d blocks of %d "
                    "(%s). Raise kv_cache_memory_bytes / gpu_memory_utilization for longer contexts",
                    model_max, pool, num_blocks, block_size, format_size(num_blocks * bytes_per_block))
        return pool
    return model_max


def build_runtime(config: EngineConfig, mcfg: ModelConfig, ids: PlaceholderIds, num_blocks: int,
                  bytes_per_block: int) -> EngineRuntime:
    """Start-up facts; one sequence of max_model_len always fits the pool, or preemption could never make room."""
    model_dir = Path(config.model_dir)
    special = SpecialTokens(ids.image_pad_id, ids.video_pad_id, ids.vision_start_id, ids.vision_end_id,
                            eos_ids=_eos_ids(model_dir, mcfg.eos_token_id))
    max_len = context_length(config, _max_positions(model_dir), num_blocks, bytes_per_block)
    return EngineRuntime(num_blocks, config.cache.block_size, max_len, mcfg.text.vocab_size,
                         mcfg.vision.spatial_merge_size, special)
