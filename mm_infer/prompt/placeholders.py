"""Media placeholders: expand one pad token per item to t*h*w/merge² tokens, check, collapse, locate."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MODALITIES = ("image", "video")


class PromptError(ValueError):
    """A prompt that cannot be turned into a request; `.status` is the HTTP status (400), `.param` the field."""

    status: int = 400

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class PlaceholderIds:
    """The token ids that frame and fill media runs."""

    image_pad_id: int
    video_pad_id: int
    vision_start_id: int
    vision_end_id: int

    def pad_id(self, modality: str) -> int:
        return self.image_pad_id if modality == "image" else self.video_pad_id


@dataclass(frozen=True)
class PlaceholderRange:
    """One media item's run of pad tokens in the expanded prompt."""

    offset: int
    length: int
    modality: str
    content_hash: str
    item_index: int  # index into the request's media items, in prompt order

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class PadRun:
    start: int
    length: int
    modality: str


def find_pad_runs(token_ids: Sequence[int], ids: PlaceholderIds) -> list[PadRun]:
    """Maximal runs of image/video pad tokens, in order."""
    arr = np.asarray(token_ids, dtype=np.int64)
    runs: list[PadRun] = []
    for modality in MODALITIES:
        mask = np.concatenate([[False], arr == ids.pad_id(modality), [False]])
        edges = np.flatnonzero(mask[1:] != mask[:-1])  # alternating run starts and ends
        runs += [PadRun(int(s), int(e - s), modality) for s, e in zip(edges[0::2], edges[1::2], strict=True)]
    return sorted(runs, key=lambda r: r.start)


def _check_run(token_ids: Sequence[int], ids: PlaceholderIds, run: PadRun, k: int, want: int,
               preexpanded: bool) -> None:
    """The k-th run of its modality must sit between vision start/end and have 1 (to expand) or `want` tokens."""
    before = token_ids[run.start - 1] if run.start > 0 else None
    end = run.start + run.length
    after = token_ids[end] if end < len(token_ids) else None
    if before != ids.vision_start_id or after != ids.vision_end_id:
        raise PromptError(
            f"{run.modality} placeholder at token {run.start} must sit between <|vision_start|> and "
            f"<|vision_end|>")
    if preexpanded and run.length != want:
        raise PromptError(f"{run.modality} {k}: pre-expanded run has {run.length} tokens, expected {want} "
                          f"(grid t*h*w/merge²)")
    if not preexpanded and run.length not in (1, want):
        raise PromptError(f"{run.modality} {k}: run of {run.length} pad tokens, expected 1 (to expand) or "
                          f"{want} (already expanded)")


def expand_placeholders(
    token_ids: Sequence[int],
    ids: PlaceholderIds,
    *,
    image_tokens: Sequence[int],
    video_tokens: Sequence[int],
    image_hashes: Sequence[str],
    video_hashes: Sequence[str],
    preexpanded: bool = False,
) -> tuple[list[int], list[PlaceholderRange], list[tuple[str, int]]]:
    """Expand (or, with preexpanded, check) each item's run; return ids, ranges and (modality, index) order.

    Without `preexpanded`, a run of length 1 is expanded; a run already of the item's full length is
    accepted as is (never expanded twice); any other length is an error. With `preexpanded`, every run
    must already have the item's full length.
    """
    expected = {"image": list(image_tokens), "video": list(video_tokens)}
    hashes = {"image": list(image_hashes), "video": list(video_hashes)}
    runs = find_pad_runs(token_ids, ids)
    for modality in MODALITIES:
        found = sum(r.modality == modality for r in runs)
        if found != len(expected[modality]):
            raise PromptError(f"prompt has {found} {modality} placeholder(s) but {len(expected[modality])} "
                              f"{modality} item(s) were given")
    out: list[int] = []
    ranges: list[PlaceholderRange] = []
    order: list[tuple[str, int]] = []
    seen = {"image": 0, "video": 0}
    cursor = 0
    for run in runs:
        k = seen[run.modality]
        seen[run.modality] += 1
        want = expected[run.modality][k]
        _check_run(token_ids, ids, run, k, want, preexpanded)
        end = run.start + run.length
        out.extend(token_ids[cursor:run.start])
        ranges.append(PlaceholderRange(len(out), want, run.modality, hashes[run.modality][k], len(order)))
        order.append((run.modality, k))
        out.extend([ids.pad_id(run.modality)] * want)
        cursor = end
    out.extend(token_ids[cursor:])
    return out, ranges, order


def collapse_placeholders(token_ids: Sequence[int], ids: PlaceholderIds) -> list[int]:
    """Replace each run of pad tokens by a single pad token (the inverse of expansion)."""
    out: list[int] = []
    cursor = 0
    for run in find_pad_runs(token_ids, ids):
        out.extend(token_ids[cursor:run.start + 1])
        cursor = run.start + run.length
    out.extend(token_ids[cursor:])
    return out
