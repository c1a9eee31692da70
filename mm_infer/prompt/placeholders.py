"""Media placeholders: expand one pad token per item to t*h*w/merge² tokens, check, collapse, locate."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MODALITIES = ("image", "video")  # the pad-run kinds of the Qwen prompts (Omni audio has its own markers)


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
    item_offset: int = 0  # first of the item's embedding rows this run holds (a Qwen3-VL video: one run per frame)

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class FramedVideo:
    """A video written per temporal patch (Qwen3-VL): the "<t seconds>" token ids of each patch, each followed
    by its own <|vision_start|> pads <|vision_end|>; all of it replaces the template's one video pad."""

    timestamps: tuple[tuple[int, ...], ...]

    def expansion(self, ids: PlaceholderIds, tokens: int) -> tuple[list[int], list[tuple[int, int, int]]]:
        """(the ids replacing one pad, each pad run in them as (offset, length, first embedding row))."""
        per = tokens // len(self.timestamps)
        out: list[int] = []
        runs = []
        for f, stamp in enumerate(self.timestamps):
            out += [*stamp, ids.vision_start_id]
            runs.append((len(out), per, f * per))
            out += [ids.video_pad_id] * per + [ids.vision_end_id]
        return out, runs


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
               preexpanded: bool, framed: bool = False) -> None:
    """The k-th run of its modality must sit between vision start/end and have 1 (to expand) or `want` tokens
    (a framed video's runs are checked against its whole expansion instead)."""
    before = token_ids[run.start - 1] if run.start > 0 else None
    end = run.start + run.length
    after = token_ids[end] if end < len(token_ids) else None
    if before != ids.vision_start_id or after != ids.vision_end_id:
        raise PromptError(
            f"{run.modality} placeholder at token {run.start} must sit between <|vision_start|> and "
            f"<|vision_end|>")
    if framed:
        return
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
    video_frames: Sequence[FramedVideo | None] | None = None,
) -> tuple[list[int], list[PlaceholderRange], list[tuple[str, int]]]:
    """Expand (or, with preexpanded, check) each item's run; return ids, ranges and (modality, index) order.

    Without `preexpanded`, a run of length 1 is expanded; a run already of the item's full length is
    accepted as is (never expanded twice); any other length is an error. With `preexpanded`, every run
    must already have the item's full length. A FramedVideo (Qwen3-VL) expands to its timestamps and frame
    runs; already expanded, the whole expansion must be there token for token.
    """
    expected = {"image": list(image_tokens), "video": list(video_tokens)}
    hashes = {"image": list(image_hashes), "video": list(video_hashes)}
    framed = {"image": [None] * len(expected["image"]), "video": list(video_frames or [None] * len(video_tokens))}
    runs = find_pad_runs(token_ids, ids)
    _check_counts(runs, expected, framed)
    out: list[int] = []
    ranges: list[PlaceholderRange] = []
    order: list[tuple[str, int]] = []
    seen = {"image": 0, "video": 0}
    cursor = i = 0
    while i < len(runs):
        run = runs[i]
        k = seen[run.modality]
        seen[run.modality] += 1
        if k >= len(expected[run.modality]):
            raise _count_error(run.modality, k + 1, k)
        want = expected[run.modality][k]
        _check_run(token_ids, ids, run, k, want, preexpanded, framed[run.modality][k] is not None)
        expansion, pads = _expansion(ids, run.modality, want, framed[run.modality][k])
        start, consumed = _located(token_ids, run, expansion, pads, preexpanded, k)
        out.extend(token_ids[cursor:start])
        ranges += [PlaceholderRange(len(out) + off, n, run.modality, hashes[run.modality][k], len(order), first)
                   for off, n, first in pads]
        order.append((run.modality, k))
        out.extend(expansion)
        cursor = start + consumed
        i += len(pads) if consumed > 1 else 1  # an expanded framed video spans one run per frame
    if missing := [m for m in MODALITIES if seen[m] != len(expected[m])]:
        raise _count_error(missing[0], seen[missing[0]], len(expected[missing[0]]))
    out.extend(token_ids[cursor:])
    return out, ranges, order


def _check_counts(runs: list[PadRun], expected: dict[str, list[int]], framed: dict[str, list]) -> None:
    """One pad run per item, up front (a framed video's count is known only once its runs are matched)."""
    for modality in MODALITIES:
        found = sum(r.modality == modality for r in runs)
        if found != len(expected[modality]) and not any(framed[modality]):
            raise _count_error(modality, found, len(expected[modality]))


def _count_error(modality: str, found: int, given: int) -> PromptError:
    more = "at least " if found > given else ""
    return PromptError(f"prompt has {more}{found} {modality} placeholder(s) but {given} {modality} item(s) were given")


def _expansion(ids: PlaceholderIds, modality: str, want: int,
               framed: FramedVideo | None) -> tuple[list[int], list[tuple[int, int, int]]]:
    if framed is None:
        return [ids.pad_id(modality)] * want, [(0, want, 0)]
    return framed.expansion(ids, want)


def _located(token_ids: Sequence[int], run: PadRun, expansion: list[int], pads: list[tuple[int, int, int]],
             preexpanded: bool, k: int) -> tuple[int, int]:
    """(first prompt index the expansion replaces, prompt tokens it replaces): 1 pad, or itself if already there."""
    start = run.start - pads[0][0]
    if run.length == pads[0][1] and start >= 0 and list(token_ids[start:start + len(expansion)]) == expansion:
        return start, len(expansion)
    if preexpanded or run.length != 1:  # _check_run has vetted plain runs; this is a framed video's
        raise PromptError(f"{run.modality} {k}: pre-expanded run does not match its expansion (timestamps "
                          f"and a run of {pads[0][1]} pads per frame)")
    return run.start, 1


def collapse_placeholders(token_ids: Sequence[int], ids: PlaceholderIds) -> list[int]:
    """Replace each run of pad tokens by a single pad token (the inverse of expansion)."""
    out: list[int] = []
    cursor = 0
    for run in find_pad_runs(token_ids, ids):
        out.extend(token_ids[cursor:run.start + 1])
        cursor = run.start + run.length
    out.extend(token_ids[cursor:])
    return out
