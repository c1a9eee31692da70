"""M-RoPE (t, h, w) position ids for text, image and video tokens: HF 5's get_rope_index, or vLLM's placement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from mm_infer.prompt.placeholders import PlaceholderRange

TEXT, IMAGE, VIDEO = 0, 1, 2
# Where text resumes after a media run: "hf" (transformers 5) at run start + max(h, w)/merge; "vllm" (vLLM 0.32,
# transformers 4) at max(positions so far) + 1. They differ after a video whose temporal span exceeds max(h, w)/merge.
MROPE_RULES = ("hf", "vllm")


def _as_grid(grid: Tensor | Sequence[Sequence[int]] | None) -> list[list[int]]:
    if grid is None:
        return []
    return torch.as_tensor(grid, dtype=torch.long).reshape(-1, 3).tolist()


def _runs(types: Tensor) -> list[tuple[int, int, int]]:
    """(start, length, type) of each maximal run of equal token types, found without a per-token loop."""
    if types.numel() == 0:
        return []
    starts = torch.cat([torch.zeros(1, dtype=torch.long), torch.nonzero(types[1:] != types[:-1]).flatten() + 1])
    lengths = torch.diff(starts, append=torch.tensor([types.numel()]))
    return list(zip(starts.tolist(), lengths.tolist(), types[starts].tolist(), strict=True))


def vision_positions(start: int, grid_thw: Sequence[int], merge: int, time_interval: float = 1.0) -> Tensor:
    """[3, t*h*w/merge^2] positions of one media item's tokens, offset by `start`.

    Temporal ids are floor(frame_index * time_interval) (float32 math, as HF), then + start.
    """
    t, h, w = (int(x) for x in grid_thw)
    gh, gw = h // merge, w // merge
    interval = torch.tensor(time_interval, dtype=torch.float32)
    tpos = (torch.arange(t) * interval).long() + start  # [t]
    hpos = torch.arange(gh) + start  # [gh]
    wpos = torch.arange(gw) + start  # [gw]
    grid = torch.meshgrid(tpos, hpos, wpos, indexing="ij")  # 3 x [t, gh, gw]
    return torch.stack(grid).reshape(3, -1)


def _interval(kind: int, seconds: float | None, tokens_per_second: float | None) -> float:
    """Temporal step of one item: tokens_per_second * second_per_grid_t for Qwen2.5-VL videos, else 1."""
    if kind != VIDEO or tokens_per_second is None:
        return 1.0
    return float(torch.tensor(1.0 if seconds is None else seconds, dtype=torch.float32) * tokens_per_second)


def positions_for_runs(num_tokens: int, runs: Sequence[tuple[int, Sequence[int], float]],
                       merge: int, after_video: str = "hf") -> tuple[Tensor, int]:
    """Positions [3, num_tokens] and the decode delta, given each media run's (offset, grid, time interval).

    Text resumes after a run by `after_video` (MROPE_RULES): "hf" at run start + max(h, w)/merge, "vllm" at
    max(the run's positions) + 1. Generated tokens continue from the last prompt token's position + 1 when the
    prompt ends in text: HF's generate (each row from its last id) and HF's forward over prompt + completion (what
    a trainer scores) both do; under "vllm" that is max + 1, vLLM's delta. A prompt that ends in media tokens
    decodes from max(all positions) + 1 (vLLM's formula, and HF's rope_deltas).
    """
    if after_video not in MROPE_RULES:
        raise ValueError(f"unknown mrope_after_video {after_video!r}, expected one of {MROPE_RULES}")
    parts: list[Tensor] = []
    pos = cursor = 0
    for offset, grid, interval in runs:
        if offset > cursor:
            parts.append((torch.arange(offset - cursor) + pos).expand(3, -1))
            pos += offset - cursor
        parts.append(vision_positions(pos, grid, merge, interval))
        pos = int(parts[-1].max()) + 1 if after_video == "vllm" else pos + max(int(grid[1]), int(grid[2])) // merge
        cursor = offset + int(grid[0]) * int(grid[1]) * int(grid[2]) // merge**2
    trailing_text = num_tokens > cursor
    if trailing_text:
        parts.append((torch.arange(num_tokens - cursor) + pos).expand(3, -1))
    positions = torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.long)
    if not num_tokens:
        return positions, 0
    resume = int(positions[0, -1]) if trailing_text else int(positions.max())
    return positions, resume + 1 - num_tokens


def mrope_from_placeholders(num_tokens: int, placeholders: Sequence[PlaceholderRange], items: Sequence[Any],
                            merge: int, tokens_per_second: float | None,
                            after_video: str = "hf") -> tuple[Tensor, int]:
    """M-RoPE of a prepared prompt from its placeholder ranges (no token scan); `items` have grid_thw and
    second_per_grid_t (MediaItem). A range holding only some of an item's frames (Qwen3-VL) has their grid."""
    runs = []
    for r in placeholders:
        item = items[r.item_index]
        kind = VIDEO if r.modality == "video" else IMAGE
        _, h, w = (int(x) for x in item.grid_thw)
        grid = (r.length * merge**2 // (h * w), h, w)  # [t of this run, h, w]
        runs.append((r.offset, grid, _interval(kind, item.second_per_grid_t, tokens_per_second)))
    return positions_for_runs(num_tokens, runs, merge, after_video)


def get_mrope_positions(
    input_ids: Sequence[int] | Tensor,
    image_grid_thw: Tensor | Sequence[Sequence[int]] | None,
    video_grid_thw: Tensor | Sequence[Sequence[int]] | None,
    *,
    image_token_id: int,
    video_token_id: int,
    vision_start_token_id: int | None = None,
    spatial_merge_size: int,
    tokens_per_second: float | None = None,
    second_per_grid_ts: Sequence[float] | Tensor | None = None,
    frame_runs: bool = False,
    after_video: str = "hf",
) -> tuple[Tensor, int]:
    """Positions [3, N] for one sequence and the decode delta (next position = seq index + delta), found by
    scanning the ids (HF's get_rope_index interface; prepared requests use mrope_from_placeholders).

    A maximal run of image (video) pad tokens is one image (video), consumed in order from its grid
    list; its length must be t*h*w/merge^2. Videos use time_interval = tokens_per_second *
    second_per_grid_ts[i] when tokens_per_second is given (Qwen2.5-VL; second_per_grid_ts defaults to 1),
    else 1 (Qwen2-VL). If vision_start_token_id is given, every run must directly follow that token. frame_runs
    (Qwen3-VL, timestamps between frames): each temporal patch of a video is its own run, grid (1, h, w)."""
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(-1).cpu()
    types = torch.zeros_like(ids)
    types[ids == image_token_id] = IMAGE
    types[ids == video_token_id] = VIDEO
    video_grids = _as_grid(video_grid_thw)
    if frame_runs:
        video_grids = [[1, h, w] for t, h, w in video_grids for _ in range(t)]
    grids = {IMAGE: iter(_as_grid(image_grid_thw)), VIDEO: iter(video_grids)}
    seconds = iter([1.0] * len(video_grids) if second_per_grid_ts is None
                   else torch.as_tensor(second_per_grid_ts, dtype=torch.float32).reshape(-1).tolist())
    runs = []
    for idx, length, kind in _runs(types):
        if kind == TEXT:
            continue
        name = "image" if kind == IMAGE else "video"
        grid = next(grids[kind], None)
        if grid is None:
            raise ValueError(f"more {name} token runs than {name} grids")
        if length != grid[0] * grid[1] * grid[2] // spatial_merge_size**2:
            raise ValueError(f"{name} run at token {idx} has {length} tokens, grid {grid} needs "
                             f"{grid[0] * grid[1] * grid[2] // spatial_merge_size**2}")
        if vision_start_token_id is not None and (idx == 0 or int(ids[idx - 1]) != vision_start_token_id):
            raise ValueError(f"{name} run at token {idx} does not follow the vision start token")
        runs.append((idx, grid, _interval(kind, next(seconds) if kind == VIDEO else None, tokens_per_second)))
    for kind, it in grids.items():
        if next(it, None) is not None:
            raise ValueError(f"more {'image' if kind == IMAGE else 'video'} grids than token runs")
    return positions_for_runs(ids.numel(), runs, spatial_merge_size, after_video)


def decode_positions(start: int, count: int, delta: int) -> Tensor:
    """[3, count] positions of tokens at sequence indices start .. start+count-1 after the prompt."""
    return (torch.arange(start, start + count) + delta).expand(3, -1).clone()
