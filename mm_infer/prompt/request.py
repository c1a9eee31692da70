"""VLMRequest: a fully prepared prompt (expanded ids, media items in prompt order, M-RoPE), and its MediaItems."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
from torch import Tensor

from mm_infer.media.packed import PackedTensor
from mm_infer.prompt.placeholders import PlaceholderRange


@dataclass(frozen=True)
class MediaItem:
    """One image or video, ready for the vision encoder.

    `media` is a one-item PackedTensor: the resized uint8 frames (what the engine ships to the device) or, given a
    rows Tensor [t*h*w, C*T*ph*pw], those rows; None while the item travels detached (media_refs.py)."""

    modality: str
    media: PackedTensor | Tensor | None
    grid_thw: tuple[int, int, int]
    content_hash: str
    second_per_grid_t: float | None = None
    timestamps: tuple[float, ...] | None = None  # seconds the prompt writes: per temporal patch (Qwen3-VL), per
    # frame (Nemotron Omni)
    frame_indices: tuple[int, ...] | None = None  # videos: the decoded frames used, as the sampler picked them
    tokens: int | None = None  # placeholder tokens when not t*h*w/merge² (audio: features [F, mel], grid (1, F, 1))

    def __post_init__(self) -> None:
        if isinstance(self.media, Tensor):  # rows form, as callers that store rows build it
            grid = torch.tensor([self.grid_thw], dtype=torch.long)
            object.__setattr__(self, "media", PackedTensor(self.media, grid, torch.ones(1, dtype=torch.long)))

    @property
    def pixel_values(self) -> Tensor:
        """[t*h*w, C*T*ph*pw] float rows, computed from the frames when the item holds frames (empty if detached)."""
        return torch.empty(0) if self.media is None else self.media.pixel_values

    @property
    def frames(self) -> tuple[Tensor, ...] | None:
        """The item's uint8 frames [T, 3, H, W] (one tensor), or None for a rows-form or detached item."""
        return None if self.media is None else self.media.frames

    @property
    def nbytes(self) -> int:
        """Bytes of the media this item carries (uint8 frames, or rows)."""
        return 0 if self.media is None else self.media.nbytes

    @property
    def num_patches(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w

    def num_tokens(self, merge: int) -> int:
        """Placeholder tokens this item expands to: t*h*w/merge² (or `tokens`, when set)."""
        return self.tokens if self.tokens is not None else self.num_patches // merge**2


def pixel_hash(packed: PackedTensor) -> str:
    """Digest of one item's pixels and grid, for media that came without an upstream content hash."""
    h = hashlib.blake2b(packed.pixel_values.float().contiguous().numpy().tobytes(), digest_size=16)
    h.update(repr(packed.imgs_sizes.tolist()).encode())
    return h.hexdigest()


def items_from_packed(modality: str, packed: PackedTensor, seconds: list[float] | None = None,
                      timestamps: list[list[float] | None] | None = None,
                      frames: list[list[int]] | None = None) -> list[MediaItem]:
    """One MediaItem per item of a PackedTensor (its upstream content hashes, else a pixel digest)."""
    parts = packed.split()
    hashes = list(packed.content_hashes) if packed.content_hashes else [pixel_hash(p) for p in parts]
    return [MediaItem(modality, part, tuple(int(x) for x in part.imgs_sizes[0].tolist()),  # type: ignore[arg-type]
                      hashes[k], None if seconds is None else float(seconds[k]),
                      None if timestamps is None or timestamps[k] is None else tuple(timestamps[k]),
                      None if frames is None else tuple(frames[k]))
            for k, part in enumerate(parts)]


@dataclass
class VLMRequest:
    """A fully prepared prompt: expanded token ids, media in prompt order and M-RoPE positions."""

    prompt_token_ids: list[int]
    placeholders: list[PlaceholderRange]  # the one record of where each media item sits
    items: list[MediaItem]  # prompt order; placeholders[i].item_index indexes this list
    mrope_positions: Tensor  # [3, L] long
    mrope_delta: int  # decode position = sequence index + delta
    prompt_text: str | None = None
    cache_salt: str | None = None  # seeds the prefix-cache hash chain: only requests with the same salt share KV

    @property
    def item_patches(self) -> list[int]:
        return [it.num_patches for it in self.items]
