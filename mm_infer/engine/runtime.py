"""Start-up facts of an engine: its device and dtype, KV pool size, context length and special token ids."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mm_infer.config import EngineConfig, EngineRuntime, SpecialTokens
from mm_infer.models.config import ModelConfig
from mm_infer.prompt.placeholders import PlaceholderIds


def pick_device(device: str) -> torch.device:
    return torch.device(device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]


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


def build_runtime(config: EngineConfig, mcfg: ModelConfig, ids: PlaceholderIds, kv_bytes_per_block: int
                  ) -> EngineRuntime:
    """KV blocks from the configured count or byte budget; the context length never exceeds what the pool holds."""
    model_dir = Path(config.model_dir)
    cache = config.cache
    special = SpecialTokens(ids.image_pad_id, ids.video_pad_id, ids.vision_start_id, ids.vision_end_id,
                            eos_ids=_eos_ids(model_dir, mcfg.eos_token_id))
    num_blocks = cache.num_kv_blocks or max(cache.kv_cache_memory_bytes // kv_bytes_per_block, 1)
    # one sequence must always fit the pool, or preemption could never make room for it
    max_len = min(config.scheduler.max_model_len or _max_positions(model_dir), num_blocks * cache.block_size)
    return EngineRuntime(num_blocks, cache.block_size, max_len, mcfg.text.vocab_size,
                         mcfg.vision.spatial_merge_size, special)
