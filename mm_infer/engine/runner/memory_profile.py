"""KV pool budget on CUDA: gpu_memory_utilization of the device, less weights, a profiled peak step and caches."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from mm_infer.config import EngineConfig
from mm_infer.media.frame_batch import FrameBatch
from mm_infer.media.patchify import DEFAULT_SPEC
from mm_infer.models.attention import DenseAttentionContext
from mm_infer.models.qwen_vl import QwenVLModel
from mm_infer.models.recurrent_batch import fresh_batch
from mm_infer.sizes import format_size
from mm_infer_kernels.geometry import PatchGeometry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemorySnapshot:
    """Device memory facts around the profile step, in bytes."""

    total: int
    used_before: int  # by everything (this process's weights, CUDA context, other processes) before the step
    allocated_before: int  # by this process's tensors before the step
    peak_allocated: int  # during the step

    def kv_budget(self, utilization: float, encoder_cache_bytes: int) -> int:
        """What is left for the KV pool: total * utilization - used - the step's activations - encoder cache."""
        activations = max(self.peak_allocated - self.allocated_before, 0)
        return int(self.total * utilization) - self.used_before - activations - encoder_cache_bytes


def _vision_grid(patches: int, merge: int) -> list[list[int]]:
    """One image grid of about `patches` patches (sides multiples of merge)."""
    side = max(merge, int(math.sqrt(patches)) // merge * merge)
    return [[1, side, side]]


def _profile_frames(grid: list[list[int]], patch: int, temporal: int, merge: int) -> FrameBatch:
    """Black uint8 frames [temporal, 3, h * patch, w * patch] of the profile grid, on the host (moved by the model)."""
    _, h, w = grid[0]
    frames = torch.zeros(temporal, 3, h * patch, w * patch, dtype=torch.uint8)
    return FrameBatch.pack([frames], DEFAULT_SPEC.normalizer("torchvision"), PatchGeometry(patch, temporal, merge))


@torch.inference_mode()
def profile_step(model: QwenVLModel, config: EngineConfig) -> None:
    """The largest step the scheduler allows: a full vision budget, a full token budget and the sampler's
    temporaries at max_num_seqs rows (log-softmax and a full-vocabulary sort)."""
    sched, device = config.scheduler, model.device
    vis = model.config.vision
    grid = _vision_grid(sched.max_encoder_tokens_per_step, vis.spatial_merge_size)
    if device.type == "cpu" or hasattr(model, "encode_items"):  # float rows: the CPU's path, and rows-only families
        pixels = torch.zeros(grid[0][1] * grid[0][2], vis.patch_dim, dtype=model.dtype, device=device)
        model.encode_vision(pixels, grid)
    else:  # a device takes uint8 frames and patchifies them itself (the runner's path off the CPU)
        model.encode_frames(_profile_frames(grid, vis.patch_size, vis.temporal_patch_size, vis.spatial_merge_size))
    tokens = min(sched.max_num_batched_tokens, sched.max_model_len or sched.max_num_batched_tokens)
    ids = torch.zeros(tokens, dtype=torch.long, device=device)
    positions = torch.arange(tokens, device=device).expand(3, -1)
    ctx = DenseAttentionContext([tokens])
    if getattr(model, "has_recurrent_state", False):  # the scan's temporaries over one sequence of the whole budget
        ctx.recurrent = fresh_batch(model.state_pool(1), [tokens])  # type: ignore[attr-defined]
    hidden = model.forward_hidden(model.embed_tokens(ids), positions, ctx)
    rows = min(sched.max_num_seqs, tokens)
    logits = model.compute_logits(hidden[:rows])  # [rows, V] float32
    torch.log_softmax(logits, dim=-1)
    torch.sort(logits, dim=-1, descending=True)


def snapshot_around_profile(model: QwenVLModel, config: EngineConfig) -> MemorySnapshot:
    device = model.device
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    free, total = torch.cuda.mem_get_info(device)
    allocated = torch.cuda.memory_allocated(device)
    profile_step(model, config)
    torch.cuda.synchronize(device)
    snap = MemorySnapshot(total, total - free, allocated, torch.cuda.max_memory_allocated(device))
    torch.cuda.empty_cache()
    return snap


def cuda_kv_budget(model: QwenVLModel, config: EngineConfig, bytes_per_block: int) -> int:
    """Bytes for the KV pool on this CUDA device; raises when not even one block fits."""
    cache = config.cache
    snap = snapshot_around_profile(model, config)
    budget = snap.kv_budget(cache.gpu_memory_utilization, int(cache.encoder_cache_bytes))
    log.info("KV budget %s: %.2f x %s total, %s in use before the profile step, %s of step activations, "
             "%s encoder cache", format_size(budget), cache.gpu_memory_utilization, format_size(snap.total),
             format_size(snap.used_before), format_size(snap.peak_allocated - snap.allocated_before),
             format_size(int(cache.encoder_cache_bytes)))
    if budget < bytes_per_block:
        raise ValueError(f"no room for the KV cache: gpu_memory_utilization {cache.gpu_memory_utilization} of "
                         f"{format_size(snap.total)} leaves {format_size(budget)} after the weights and a peak step "
                         f"({format_size(snap.used_before)} in use, {format_size(snap.peak_allocated)} peak); "
                         "raise gpu_memory_utilization or lower max_num_batched_tokens / max_num_seqs")
    return budget
