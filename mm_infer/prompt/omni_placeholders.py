"""Nemotron Omni placeholders: <image> / <video> markers -> <img> runs with frame labels, <so_embedding> markers ->
<so_start> runs <so_end>, as HF's processor writes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mm_infer.prompt.placeholders import PlaceholderRange, PromptError
from mm_infer.prompt.request import MediaItem


@dataclass(frozen=True)
class OmniTokens:
    """Token ids of the Omni prompt: `<image>` holds image and video features alike; `<video>` only marks a video."""

    image: int
    video: int
    start: int  # <img>
    end: int  # </img>
    audio: int | None = None  # <so_embedding> (None: a tokenizer without audio tokens)
    audio_start: int | None = None  # <so_start>
    audio_end: int | None = None  # <so_end>


@dataclass(frozen=True)
class OmniText:
    """The tokenizer as expansion needs it: text <-> ids, and the added tokens that split text (HF tokenizes each
    stretch between added tokens on its own)."""

    encode: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]
    added: frozenset[int] = field(default_factory=frozenset)

    @staticmethod
    def of(tokenizer: Any) -> OmniText:
        """Our Tokenizer (tokenizers backend) or an HF tokenizer."""
        backend = getattr(tokenizer, "backend", None)  # transformers 5's tokenizers name theirs: a str
        table = (backend.get_added_tokens_decoder() if hasattr(backend, "get_added_tokens_decoder")
                 else getattr(tokenizer, "added_tokens_decoder", {}))
        return OmniText(lambda s: list(tokenizer.encode(s, add_special_tokens=False)),
                        lambda ids: str(tokenizer.decode(list(ids), skip_special_tokens=False)),
                        frozenset(int(i) for i in table))


def frame_labels(num_frames: int, n_tubelets: int, temporal_patch: int,
                 seconds: Sequence[float] | None) -> list[str]:
    """HF's per-tubelet labels: "Frame 1 sampled at 0.00 seconds and frame 2 sampled at 0.50 seconds: "; the
    padded frames of the last tubelet are left out, and without times a part is just "Frame k"."""
    labels = []
    for group in range(n_tubelets):
        parts = []
        for k in range(group * temporal_patch, min((group + 1) * temporal_patch, num_frames)):
            name = f"{'Frame' if k % temporal_patch == 0 else 'frame'} {k + 1}"
            timed = seconds is not None and k < len(seconds)
            parts.append(f"{name} sampled at {seconds[k]:.2f} seconds" if timed else name)
        labels.append(" and ".join(parts) + ": ")
    return labels


@dataclass(frozen=True)
class OmniVideo:
    """One video's expansion: a label and a run of `per_run` <image> tokens per tubelet."""

    labels: tuple[str, ...]
    per_run: int

    @staticmethod
    def of(item: MediaItem, merge: int, temporal_patch: int) -> OmniVideo:
        t, h, w = item.grid_thw
        frames = (int(item.media.num_frames[0]) if item.media is not None
                  else len(item.frame_indices) if item.frame_indices else t * temporal_patch)
        return OmniVideo(tuple(frame_labels(frames, t, temporal_patch, item.timestamps)), h * w // merge**2)

    def tail(self, tok: OmniTokens, text: OmniText) -> list[int]:
        """The ids after the first run's </img>: "\\n" + label, <img>, the run, </img>, for each later tubelet."""
        out: list[int] = []
        for label in self.labels[1:]:
            out += [*text.encode("\n" + label), tok.start, *[tok.image] * self.per_run, tok.end]
        return out


def _segment_start(ids: Sequence[int], stops: frozenset[int]) -> int:
    """Index after the last added token of `ids` (where HF's tokenizer starts the text stretch that ends here)."""
    for j in range(len(ids) - 1, -1, -1):
        if ids[j] in stops:
            return j + 1
    return 0


class _Expansion:
    """The expanded ids, one PlaceholderRange per <image> run and the items' prompt order, built left to right."""

    def __init__(self, tok: OmniTokens, text: OmniText, images: Sequence[MediaItem], videos: Sequence[MediaItem],
                 merge: int, temporal_patch: int, audios: Sequence[MediaItem] = ()) -> None:
        self.tok, self.text = tok, text
        self.stops = text.added | {tok.image, tok.video, tok.start, tok.end}
        self.items = {"image": list(images), "video": list(videos), "audio": list(audios)}
        self.videos = [OmniVideo.of(v, merge, temporal_patch) for v in videos]
        self.image_tokens = [it.num_tokens(merge) for it in images]
        self.audio_tokens = [it.num_tokens(merge) for it in audios]  # the item's own count (HF's rule)
        self.out: list[int] = []
        self.ranges: list[PlaceholderRange] = []
        self.order: list[tuple[str, int]] = []
        self.seen = {"image": 0, "video": 0, "audio": 0}

    def take(self, modality: str) -> int:
        """The next item of this modality (a PromptError when the prompt has more placeholders than items)."""
        k = self.seen[modality]
        if k >= len(self.items[modality]):
            raise PromptError(f"prompt has more {modality} placeholders than the {k} {modality} item(s) given")
        self.seen[modality] += 1
        return k

    def run(self, modality: str, k: int, length: int, first_row: int) -> None:
        """Record the run of `length` <image> tokens that starts at the end of `out` (not yet appended)."""
        self.ranges.append(PlaceholderRange(len(self.out), length, modality, self.items[modality][k].content_hash,
                                            len(self.order), first_row))

    def image(self, k: int) -> None:
        n = self.image_tokens[k]
        self.out.append(self.tok.start)
        self.run("image", k, n, 0)
        self.out += [self.tok.image] * n + [self.tok.end]
        self.order.append(("image", k))

    def video(self, k: int) -> None:
        """Expand a <video> marker; the first label is tokenized with the text stretch before it, as HF does (a
        stretch ending in a space joins the label's first word)."""
        v, seg = self.videos[k], _segment_start(self.out, self.stops)
        joint = self.text.encode(self.text.decode(self.out[seg:]) + v.labels[0])
        self.out[seg:] = joint
        tail = v.tail(self.tok, self.text)
        self.out.append(self.tok.start)
        first = len(self.out)
        self.out += [self.tok.image] * v.per_run + [self.tok.end] + tail
        self._video_runs(k, first)
        self.order.append(("video", k))

    def _video_runs(self, k: int, first: int) -> None:
        """One range per tubelet run of the video whose first run starts at out[first]."""
        v, at = self.videos[k], first
        for t in range(len(v.labels)):
            while self.out[at] != self.tok.image:
                at += 1
            self.ranges.append(PlaceholderRange(at, v.per_run, "video", self.items["video"][k].content_hash,
                                                len(self.order), t * v.per_run))
            at += v.per_run

    def marker(self, raw: Sequence[int], i: int, preexpanded: bool) -> int:
        """Expand the single <image> or the <video> at raw[i]; returns the index after it."""
        modality = "video" if raw[i] == self.tok.video else "image"
        if modality == "image" and i + 1 < len(raw) and raw[i + 1] == self.tok.image:
            raise PromptError(f"a run of <image> tokens at token {i} has no <img> before it")
        if preexpanded:
            raise PromptError(f"{modality} {self.seen[modality]}: media_tokens_preexpanded is set, but the prompt has "
                              f"an unexpanded <{modality}> at token {i}")
        k = self.take(modality)
        if modality == "image":
            self.image(k)
        else:
            self.video(k)
        return i + 1

    def expanded(self, raw: Sequence[int], i: int) -> int:
        """An expanded run at raw[i] (its <img> already copied): the next video's whole expansion when that
        video's first label ends the text before it, else the next image's; checked token for token."""
        kv = self.seen["video"]
        if kv < len(self.videos) and self._label_before(self.videos[kv].labels[0]):
            return self._expanded_video(raw, i)
        k = self.take("image")
        n = self.image_tokens[k]
        want = [self.tok.image] * n + [self.tok.end]
        if list(raw[i:i + n + 1]) != want:
            raise PromptError(f"image {k}: the expanded run at token {i} does not match its expansion "
                              f"(<img>, {n} <image>, </img>)")
        self.run("image", k, n, 0)
        self.out += want
        self.order.append(("image", k))
        return i + n + 1

    def _label_before(self, label: str) -> bool:
        """The text since the last added token before the copied <img> ends with `label`, in its own tokens or
        tokenized with the text before it (as expansion writes it)."""
        seg = _segment_start(self.out[:-1], self.stops)
        ids = self.out[seg:-1]
        text = self.text.decode(ids)
        own = self.text.encode(label)
        return text.endswith(label) and (ids[len(ids) - len(own):] == own or self.text.encode(text) == ids)

    def _expanded_video(self, raw: Sequence[int], i: int) -> int:
        k = self.take("video")
        v = self.videos[k]
        want = [self.tok.image] * v.per_run + [self.tok.end] + v.tail(self.tok, self.text)
        if list(raw[i:i + len(want)]) != want:
            raise PromptError(f"video {k}: the expanded runs at token {i} do not match its expansion "
                              f"({len(v.labels)} tubelets of {v.per_run} <image> tokens, each with its frame label)")
        first = len(self.out)
        self.out += want
        self._video_runs(k, first)
        self.order.append(("video", k))
        return i + len(want)

    def audio(self, raw: Sequence[int], i: int, preexpanded: bool) -> int:
        """A <so_embedding> at raw[i]: after a copied <so_start>, the next audio's expanded run, checked token for
        token; else a marker, expanded to <so_start>, n <so_embedding>, <so_end>. Returns the index after it."""
        tok = self.tok
        if tok.audio is None or tok.audio_start is None or tok.audio_end is None:
            raise PromptError("this tokenizer lacks <so_start> / <so_end>: audio markers cannot be expanded")
        expanded = i > 0 and raw[i - 1] == tok.audio_start
        if not expanded and i + 1 < len(raw) and raw[i + 1] == tok.audio:
            raise PromptError(f"a run of <so_embedding> tokens at token {i} has no <so_start> before it")
        if not expanded and preexpanded:
            raise PromptError(f"audio {self.seen['audio']}: media_tokens_preexpanded is set, but the prompt has an "
                              f"unexpanded <so_embedding> at token {i}")
        k = self.take("audio")
        n = self.audio_tokens[k]
        want = [tok.audio] * n + [tok.audio_end]
        if expanded and list(raw[i:i + n + 1]) != want:
            raise PromptError(f"audio {k}: the expanded run at token {i} does not match its expansion "
                              f"(<so_start>, {n} <so_embedding>, <so_end>)")
        if not expanded:
            self.out.append(tok.audio_start)
        self.run("audio", k, n, 0)
        self.out += want
        self.order.append(("audio", k))
        return i + (n + 1 if expanded else 1)

    def check_all_used(self) -> None:
        for modality, items in self.items.items():
            if self.seen[modality] != len(items):
                raise PromptError(f"prompt has {self.seen[modality]} {modality} placeholder(s) but {len(items)} "
                                  f"{modality} item(s) were given")


def expand_omni(raw: Sequence[int], tok: OmniTokens, text: OmniText, images: Sequence[MediaItem],
                videos: Sequence[MediaItem], *, merge: int = 2, temporal_patch: int = 2, preexpanded: bool = False,
                audios: Sequence[MediaItem] = ()) -> tuple[list[int], list[PlaceholderRange], list[tuple[str, int]]]:
    """Expand each <image> / <video> / <so_embedding> marker (or check each expanded run, never expanding it
    again); return the ids, one range per <image> or <so_embedding> run (a video: one per tubelet, item_offset its
    first feature row) and the items' (modality, index) in prompt order."""
    exp = _Expansion(tok, text, images, videos, merge, temporal_patch, audios)
    i = 0
    while i < len(raw):
        t = raw[i]
        if tok.audio is not None and t == tok.audio:
            i = exp.audio(raw, i, preexpanded)
        elif t == tok.video or (t == tok.image and (i == 0 or raw[i - 1] != tok.start)):
            i = exp.marker(raw, i, preexpanded)
        elif t == tok.image:
            i = exp.expanded(raw, i)
        else:
            exp.out.append(t)
            i += 1
    exp.check_all_used()
    return exp.out, exp.ranges, exp.order


def check_pruning(videos: Sequence[MediaItem], video_pruning_rate: float) -> None:
    """EVS (video_pruning_rate > 0) drops video tokens after the merge, which we do not do: refuse videos."""
    if videos and video_pruning_rate > 0:
        raise PromptError(f"this checkpoint sets video_pruning_rate={video_pruning_rate} (EVS), which is not "
                          "supported: videos are refused (images and text work)")


def flat_positions(length: int) -> tuple[Tensor, int]:
    """The Nemotron LM has no RoPE: [3, L] rows of arange(L) and delta 0, so decode positions stay consistent."""
    return torch.arange(length, dtype=torch.long).expand(3, length).clone(), 0
