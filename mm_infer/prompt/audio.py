"""Audio for a prompt (Nemotron Omni): sources (encoded bytes, a path, a waveform) -> log-mel feature MediaItems."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mm_infer.media.errors import MediaError, MediaInvalidError
from mm_infer.media.limits import DEFAULT_LIMITS, MediaLimits
from mm_infer.media.omni_audio import AudioFeatureSpec, audio_features, decode_audio, resample, token_count
from mm_infer.media.sources import read_encoded
from mm_infer.prompt.placeholders import PromptError
from mm_infer.prompt.request import MediaItem

ENCODED = (bytes, bytearray, memoryview, str, os.PathLike)


def audio_refusal(model: str) -> PromptError:
    """The 400 for audio given to a model without an audio tower."""
    return PromptError(f"{model} has no audio tower: audio input is not served for this model",
                       param="multi_modal_data")


def audio_item(wave: Tensor, spec: AudioFeatureSpec, content_hash: str) -> MediaItem:
    """A mono waveform [L] at spec.sampling_rate -> MediaItem(features [1 + L//hop, mel], grid (1, F, 1), its
    <so_embedding> count as HF's processor counts it)."""
    feats, _ = audio_features(wave, spec)  # [F, mel]
    return MediaItem("audio", feats, (1, int(feats.shape[0]), 1), content_hash,
                     tokens=token_count(int(wave.shape[0]), spec))


def _digest(kind: bytes, payload: bytes, spec: AudioFeatureSpec) -> str:
    h = hashlib.sha256(kind + b"\0" + payload)
    h.update(repr(spec).encode())  # the options: another feature setting is another item
    return h.hexdigest()


def encoded_audio_item(data: bytes, spec: AudioFeatureSpec) -> MediaItem:
    """WAV / FLAC / MP3 bytes -> the audio MediaItem, hashed by the bytes and the feature settings."""
    return audio_item(decode_audio(data, spec.sampling_rate), spec, _digest(b"encoded", data, spec))


def _waveform(array: Any, rate: int, spec: AudioFeatureSpec) -> Tensor:
    """A float waveform (numpy or torch) at `rate` -> mono float32 [L] at spec.sampling_rate (FFmpeg resampling)."""
    wave = np.asarray(array.detach().cpu() if isinstance(array, Tensor) else array, dtype=np.float32).squeeze()
    if wave.ndim != 1:
        raise MediaInvalidError(f"a waveform is mono [samples], got shape {tuple(np.shape(array))}")
    if rate <= 0:
        raise MediaInvalidError(f"sampling rate {rate} is not positive")
    if rate != spec.sampling_rate:
        wave = resample(wave, rate, spec.sampling_rate)
    return torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float32))


def _one(source: Any, spec: AudioFeatureSpec, limits: MediaLimits) -> MediaItem:
    if isinstance(source, ENCODED):
        return encoded_audio_item(read_encoded(source, limits=limits).data, spec)
    rate = spec.sampling_rate
    if isinstance(source, tuple) and _is_rate_pair(source):
        source, rate = source[0], int(source[1])
    if not isinstance(source, (np.ndarray, Tensor)):
        raise MediaInvalidError(f"expected bytes, a path, a float waveform or (waveform, sampling_rate), "
                                f"got {type(source).__name__}")
    wave = _waveform(source, rate, spec)
    return audio_item(wave, spec, _digest(b"waveform", wave.numpy().tobytes(), spec))


def audio_items(sources: Any, spec: AudioFeatureSpec | None, model: str,
                limits: MediaLimits = DEFAULT_LIMITS) -> list[MediaItem]:
    """multi_modal_data["audio"] (one source or a list) -> one MediaItem each, in order; a bad item is an error
    naming it (its status kept), any audio for a model without an audio tower a PromptError naming the model."""
    if spec is None:
        raise audio_refusal(model)
    many = isinstance(sources, list) or (isinstance(sources, tuple) and not _is_rate_pair(sources))
    out = []
    for k, source in enumerate(list(sources) if many else [sources]):
        try:
            out.append(_one(source, spec, limits))
        except MediaError as e:
            raise MediaError(f"audio {k}: {e}", status=e.status) from None
    return out


def _is_rate_pair(x: Sequence[Any]) -> bool:
    return len(x) == 2 and isinstance(x[1], (int, float)) and not isinstance(x[1], bool)
