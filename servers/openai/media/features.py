"""Render's multimodal features: processed items kept by content hash, handed out and taken back, never redone."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch

from mm_infer.media.cache import ByteLRU
from mm_infer.media.omni_audio import AudioFeatureSpec, token_count
from mm_infer.media.packed import PackedTensor
from mm_infer.media.patchify import BACKENDS, DEFAULT_SPEC, PatchSpec, norm_table
from mm_infer.prompt.request import MediaItem, VLMRequest
from servers.openai.bodies.errors import ApiError
from servers.openai.bodies.generate import MODALITIES, MultiModalFeatures, PlaceholderRangeInfo
from servers.openai.bodies.replies import prompt_media
from servers.openai.media.request_media import media_client_scope

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
            "frame_indices": None if item.frame_indices is None else list(item.frame_indices),
            "tokens": item.tokens, **form}
    return base64.b64encode(json.dumps(head).encode() + b"\n" + raw).decode("ascii")


class InlineError(ValueError):
    """An inline item this checkpoint cannot take as it is (a 400 naming the problem)."""


def _check_spec(head: dict, spec: PatchSpec) -> None:
    """A frames payload's patch spec must be this checkpoint's, field by field: the client's spec would make other
    tokens (merge_size), or rows the vision tower was never trained on (mean, std, temporal_patch_size)."""
    given = head["spec"]
    if not isinstance(given, dict) or set(given) != {f.name for f in dataclasses.fields(PatchSpec)}:
        raise InlineError(f"its patch spec must have the fields {[f.name for f in dataclasses.fields(PatchSpec)]}")
    for name, want in dataclasses.asdict(spec).items():
        got = tuple(given[name]) if isinstance(want, tuple) and isinstance(given[name], list) else given[name]
        if type(got) is bool or got != want:  # NaN never equals: a NaN mean or std is refused here too
            raise InlineError(f"its patch spec has {name} {given[name]!r}, this checkpoint's is {want!r}")
    if head["backend"] not in BACKENDS:
        raise InlineError(f"its backend is {head['backend']!r}, expected one of {list(BACKENDS)}")


@lru_cache(maxsize=8)
def _row_bounds(spec: PatchSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """[3] float32 lowest and highest value each channel's normalisation gives any uint8 value, over the backends."""
    tables = np.stack([norm_table(spec.normalizer(b)) for b in BACKENDS])  # [backends, 3, 256]
    return torch.from_numpy(tables.min(axis=(0, 2))), torch.from_numpy(tables.max(axis=(0, 2)))


def _check_rows(rows: torch.Tensor, spec: PatchSpec) -> None:
    """Rows-payload pixels must be shaped as this checkpoint's patches and hold only values its normalisation can
    produce: finite, each channel within [(0 - mean) / std, (1 - mean) / std] (one rounding of the row dtype)."""
    if not rows.is_floating_point():
        raise InlineError(f"its pixel rows are {str(rows.dtype).removeprefix('torch.')}, not float")
    width = len(spec.image_mean) * spec.temporal_patch_size * spec.patch_size ** 2
    if rows.ndim != 2 or rows.shape[1] != width:
        raise InlineError(f"its pixel rows have shape {list(rows.shape)}, this checkpoint's patches are rows of "
                          f"{width} ({len(spec.image_mean)} channels x temporal_patch_size {spec.temporal_patch_size} "
                          f"x {spec.patch_size} x {spec.patch_size})")
    x = rows.float().view(rows.shape[0], len(spec.image_mean), -1)  # [rows, C, T*p*p]
    if not bool(torch.isfinite(x).all()):
        raise InlineError("its pixel rows hold values that are not finite (NaN or infinity)")
    lo, hi = _row_bounds(spec)
    tol = torch.finfo(rows.dtype).eps * torch.maximum(lo.abs(), hi.abs()).clamp(min=1.0)  # [C]
    low, high = x.amin(dim=(0, 2)), x.amax(dim=(0, 2))  # [C]
    for c in range(len(lo)):
        if low[c] < lo[c] - tol[c] or high[c] > hi[c] + tol[c]:
            raise InlineError(f"its pixel rows of channel {c} span [{low[c].item():.6g}, {high[c].item():.6g}], "
                              f"outside [{lo[c].item():.6g}, {hi[c].item():.6g}], what this checkpoint's "
                              "normalisation makes of pixels")


def _check_grid(grid: tuple[int, int, int], spec: PatchSpec) -> None:
    _, h, w = grid
    if min(grid) < 1 or h % spec.merge_size or w % spec.merge_size:
        raise InlineError(f"its grid {list(grid)} is not whole {spec.merge_size}x{spec.merge_size} merge units")


def _check_timing(head: dict) -> None:
    """Video timing feeds M-RoPE positions and prompt text: finite, and seconds per temporal patch positive."""
    s = head.get("second_per_grid_t")
    if s is not None and (isinstance(s, bool) or not isinstance(s, int | float) or not 0 < s <= 86400):
        raise InlineError(f"its second_per_grid_t is {s!r}, not a number of seconds in (0, 86400]")
    stamps = head.get("timestamps")
    if stamps is not None and not all(isinstance(x, int | float) and math.isfinite(x) for x in stamps):
        raise InlineError("its timestamps are not all finite numbers")


def _media(head: dict, raw: bytes, spec: PatchSpec) -> PackedTensor:
    """The header's media: uint8 frames (form "frames") or, the older payload, float rows [t*h*w, C*T*ph*pw];
    InlineError unless it is shaped, specced and valued as this checkpoint's `spec` makes media."""
    dtype = _DTYPES[head["dtype"]]
    shape = [int(x) for x in head["shape"]]
    grid = tuple(int(x) for x in head["grid_thw"])
    _check_grid(grid, spec)
    _check_timing(head)
    np_dtype = np.int16 if dtype == torch.bfloat16 else torch.empty(0, dtype=dtype).numpy().dtype
    data = torch.from_numpy(np.frombuffer(raw, dtype=np_dtype).copy()).reshape(shape)
    data = data.view(torch.bfloat16) if dtype == torch.bfloat16 else data
    if head.get("form") == "frames":
        _check_spec(head, spec)
        if data.ndim != 4 or data.shape[2] % spec.factor or data.shape[3] % spec.factor:
            raise InlineError(f"its frames have shape {list(data.shape)}, not [T, 3, H, W] with H and W multiples "
                              f"of {spec.factor}")
        return PackedTensor.from_frames([data], backend=head["backend"], spec=spec)
    _check_rows(data, spec)
    return PackedTensor(data, torch.tensor([list(grid)]), torch.ones(1, dtype=torch.long))


def _audio_item(head: dict, raw: bytes, audio: AudioFeatureSpec | None) -> MediaItem:
    """An inline audio item: float32 log-mel features [F, mel] of this checkpoint's extractor, grid (1, F, 1); its
    token count is recomputed from F (HF's rule), never taken from the client."""
    if audio is None:
        raise InlineError("it is audio, and this model has no audio tower")
    if head.get("dtype") != "float32" or head.get("form") is not None:
        raise InlineError(f"audio features are float32 rows, got {head.get('dtype')!r} {head.get('form') or 'rows'}")
    frames, mel = (int(x) for x in head["shape"])
    if mel != audio.feature_size or frames < 2 or [int(x) for x in head["grid_thw"]] != [1, frames, 1]:
        raise InlineError(f"audio features of shape {[frames, mel]} with grid {head['grid_thw']}: expected "
                          f"[F >= 2, {audio.feature_size}] with grid [1, F, 1]")
    feats = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy()).reshape(frames, mel)  # [F, mel]
    if not bool(torch.isfinite(feats).all()):
        raise InlineError("its audio features hold values that are not finite (NaN or infinity)")
    tokens = token_count((frames - 1) * audio.count_hop, audio)  # F = 1 + L // hop mel frames
    if head.get("tokens") not in (None, tokens):
        raise InlineError(f"its header says {head['tokens']} tokens, {frames} mel frames make {tokens}")
    digest = hashlib.blake2b(raw, digest_size=16)
    digest.update(repr((frames, mel, "audio")).encode())
    return MediaItem("audio", feats, (1, frames, 1), f"inline-{digest.hexdigest()}", tokens=tokens)


def _unpack(data: str) -> tuple[dict, bytes]:
    head_bytes, raw = base64.b64decode(data, validate=True).split(b"\n", 1)
    return json.loads(head_bytes), raw


def decode_item(data: str, modality: str, where: str, spec: PatchSpec = DEFAULT_SPEC,
                audio: AudioFeatureSpec | None = None) -> MediaItem:
    """An inline item (400 naming `where` if it is malformed, or not what this checkpoint's `spec` / `audio`
    makes of media); it is keyed by a digest of its own media."""
    try:
        head, raw = _unpack(data)
        if modality == "audio" or head.get("modality") == "audio":
            if head.get("modality") != modality:
                raise InlineError(f"it is a {head.get('modality')} item, listed as {modality}")
            return _audio_item(head, raw, audio)
        t, h, w = (int(x) for x in head["grid_thw"])
        media = _media(head, raw, spec)
    except InlineError as e:
        raise ApiError(400, f"{where}: inline item refused: {e}", param="features.kwargs_data") from None
    except (ValueError, KeyError, TypeError, RuntimeError, ArithmeticError) as e:
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


def resolve_items(features: MultiModalFeatures | None, store: FeatureStore, spec: PatchSpec = DEFAULT_SPEC,
                  audio: AudioFeatureSpec | None = None) -> dict[str, list[MediaItem]]:
    """Each modality's items in order: from the cache by hash, else inline (checked against the checkpoint's patch
    `spec` and audio features `audio`); a 400 naming the item otherwise."""
    out: dict[str, list[MediaItem]] = {m: [] for m in MODALITIES}
    if features is None:
        return out
    for m, hashes in features.mm_hashes.items():
        inline = (features.kwargs_data or {}).get(m) or [None] * len(hashes)
        for k, (h, data) in enumerate(zip(hashes, inline, strict=True)):
            where = f"features {m} {k} (hash {h[:16]})"
            item = store.get(h)
            if item is None and data is not None:
                item = decode_item(data, m, where, spec, audio)
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
