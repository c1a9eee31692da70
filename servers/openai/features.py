"""Render's multimodal features: processed items kept by content hash, handed out and taken back, never redone."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections.abc import Sequence

import numpy as np
import torch

from mm_infer.media.cache import ByteLRU
from mm_infer.media.packed import PackedTensor
from mm_infer.media.patchify import PatchSpec
from mm_infer.prompt.request import MediaItem, VLMRequest
from servers.openai.generate_protocol import MODALITIES, MultiModalFeatures, PlaceholderRangeInfo
from servers.openai.media import media_client_scope
from servers.openai.replies import ApiError, prompt_media

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "uint8": torch.uint8}


class FeatureStore:
    """Items a render processed, by (client scope, content hash): /generate takes them back without a decode."""

    def __init__(self, capacity_bytes: int) -> None:
        self._items: ByteLRU[MediaItem] = ByteLRU(capacity_bytes)

    @staticmethod
    def _key(content_hash: str) -> str:
        return hashlib.sha256(repr((media_client_scope.get(), content_hash)).encode()).hexdigest()

    def put(self, items: Sequence[MediaItem]) -> None:
        for it in items:
            self._items.put(self._key(it.content_hash), it, it.nbytes)

    def get(self, content_hash: str) -> MediaItem | None:
        return self._items.get(self._key(content_hash))

    def clear(self) -> None:
        self._items.clear()


def _payload(item: MediaItem) -> tuple[torch.Tensor, dict]:
    """What an item ships inline: its uint8 frames [T, 3, H, W] with how to make rows, else its rows."""
    media = item.media
    if media is not None and media.frames is not None:
        return media.frames[0].detach().cpu().contiguous(), {"form": "frames", "backend": media.backend,
                                                             "spec": dataclasses.asdict(media.spec)}
    return item.pixel_values.detach().cpu().contiguous(), {}  # [t*h*w, C*T*ph*pw]


def encode_item(item: MediaItem) -> str:
    """One item inline: a JSON header line (grid, hash, frames, dtype, shape, form) then its media's raw bytes."""
    pv, form = _payload(item)
    raw = (pv.view(torch.int16) if pv.dtype == torch.bfloat16 else pv).numpy().tobytes()
    head = {"modality": item.modality, "grid_thw": list(item.grid_thw), "content_hash": item.content_hash,
            "second_per_grid_t": item.second_per_grid_t, "dtype": str(pv.dtype).removeprefix("torch."),
            "shape": list(pv.shape), "timestamps": None if item.timestamps is None else list(item.timestamps),
            "frame_indices": None if item.frame_indices is None else list(item.frame_indices), **form}
    return base64.b64encode(json.dumps(head).encode() + b"\n" + raw).decode("ascii")


def _media(head: dict, raw: bytes) -> PackedTensor:
    """The header's media: uint8 frames (form "frames") or, the older payload, float rows [t*h*w, C*T*ph*pw]."""
    dtype = _DTYPES[head["dtype"]]
    shape = [int(x) for x in head["shape"]]
    np_dtype = np.int16 if dtype == torch.bfloat16 else torch.empty(0, dtype=dtype).numpy().dtype
    data = torch.from_numpy(np.frombuffer(raw, dtype=np_dtype).copy()).reshape(shape)
    data = data.view(torch.bfloat16) if dtype == torch.bfloat16 else data
    if head.get("form") == "frames":
        spec = head["spec"]
        spec = PatchSpec(**{**spec, "image_mean": tuple(spec["image_mean"]), "image_std": tuple(spec["image_std"])})
        return PackedTensor.from_frames([data], backend=head["backend"], spec=spec)
    rows, _ = shape
    t, h, w = (int(x) for x in head["grid_thw"])
    return PackedTensor(data, torch.tensor([[t, h, w]]), torch.ones(1, dtype=torch.long))


def decode_item(data: str, modality: str, where: str) -> MediaItem:
    """An inline item (400 naming `where` if it is malformed); it is keyed by a digest of its own media."""
    try:
        blob = base64.b64decode(data, validate=True)
        head_bytes, raw = blob.split(b"\n", 1)
        head = json.loads(head_bytes)
        t, h, w = (int(x) for x in head["grid_thw"])
        media = _media(head, raw)
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise ApiError(400, f"{where}: kwargs_data is not an item this server encoded ({e})",
                       param="features.kwargs_data") from None
    if head.get("modality") != modality or media.imgs_sizes[0].tolist() != [t, h, w]:
        raise ApiError(400, f"{where}: inline item is a {head.get('modality')} of grid "
                       f"{media.imgs_sizes[0].tolist()}, its header says {(t, h, w)}", param="features.kwargs_data")
    digest = hashlib.blake2b(raw, digest_size=16)
    form = (head["form"], head["backend"], media.spec) if head.get("form") == "frames" else ()
    digest.update(repr((t, h, w, head["dtype"], *form)).encode())
    stamps, frames = head.get("timestamps"), head.get("frame_indices")
    return MediaItem(modality, media, (t, h, w), f"inline-{digest.hexdigest()}", head.get("second_per_grid_t"),
                     None if stamps is None else tuple(float(s) for s in stamps),
                     None if frames is None else tuple(int(f) for f in frames))


def item_spans(req: VLMRequest) -> list[tuple[int, int]]:
    """Each item's (offset, length): its first pad to its last (a Qwen3-VL video spans its frames' runs)."""
    first: dict[int, int] = {}
    end: dict[int, int] = {}
    for r in req.placeholders:
        first[r.item_index] = min(first.get(r.item_index, r.offset), r.offset)
        end[r.item_index] = max(end.get(r.item_index, r.end), r.end)
    return [(first[i], end[i] - first[i]) for i in range(len(req.items))]


def features_of(req: VLMRequest, inline: bool) -> MultiModalFeatures | None:
    """The features of a prepared prompt (None without media): hashes, spans, items; pixels inline if asked."""
    if not req.items:
        return None
    spans = item_spans(req)
    kinds = [m for m in MODALITIES if any(it.modality == m for it in req.items)]
    mine = {m: [i for i, it in enumerate(req.items) if it.modality == m] for m in kinds}
    return MultiModalFeatures(
        mm_hashes={m: [req.items[i].content_hash for i in mine[m]] for m in kinds},
        mm_placeholders={m: [PlaceholderRangeInfo(offset=spans[i][0], length=spans[i][1]) for i in mine[m]]
                         for m in kinds},
        kwargs_data={m: [encode_item(req.items[i]) if inline else None for i in mine[m]] for m in kinds},
        mm_items={m: prompt_media([req.items[i] for i in mine[m]], []) for m in kinds})


def resolve_items(features: MultiModalFeatures | None, store: FeatureStore) -> dict[str, list[MediaItem]]:
    """Each modality's items in order: from the cache by hash, else inline; a 400 naming the item otherwise."""
    out: dict[str, list[MediaItem]] = {m: [] for m in MODALITIES}
    if features is None:
        return out
    for m, hashes in features.mm_hashes.items():
        inline = (features.kwargs_data or {}).get(m) or [None] * len(hashes)
        for k, (h, data) in enumerate(zip(hashes, inline, strict=True)):
            where = f"features {m} {k} (hash {h[:16]})"
            item = store.get(h)
            if item is None and data is not None:
                item = decode_item(data, m, where)
            if item is None:
                raise ApiError(400, f"{where}: not in this server's feature cache (evicted, or rendered elsewhere "
                               "or by another client); render it again, or render with mm_payload \"tensors\" to "
                               "carry it inline", param="features.mm_hashes")
            if item.modality != m:
                raise ApiError(400, f"{where}: that hash names a {item.modality} item, not {m}",
                               param="features.mm_hashes")
            out[m].append(item)
    return out


def check_placeholders(features: MultiModalFeatures | None, req: VLMRequest) -> None:
    """Every item's placeholder must be where token_ids put its run (400 naming the item otherwise)."""
    if features is None:
        return
    spans = item_spans(req)
    seen = {m: 0 for m in MODALITIES}
    for i, it in enumerate(req.items):
        k = seen[it.modality]
        seen[it.modality] += 1
        given = features.mm_placeholders[it.modality][k]
        offset, length = spans[i]
        if (given.offset, given.length) != (offset, length):
            raise ApiError(400, f"features {it.modality} {k} (hash {it.content_hash[:16]}): placeholder at offset "
                           f"{given.offset}, length {given.length}, but token_ids hold its run at offset {offset}, "
                           f"length {length}", param="features.mm_placeholders")
