"""Nemotron Omni audio: WAV/FLAC/MP3 bytes -> mono float32 16 kHz waveform (PyAV), HF's ParakeetFeatureExtractor
log-mel features in torch, and the <so_embedding> count HF's Omni processor gives a waveform."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mm_infer.media.errors import MediaDecodeError, MediaInvalidError

AUDIO_START, AUDIO_TOKEN, AUDIO_END = "<so_start>", "<so_embedding>", "<so_end>"
LOG_GUARD = 2.0 ** -24  # added before the log
STD_EPS = 1e-5  # added to the std


@dataclass(frozen=True)
class AudioFeatureSpec:
    """preprocessor_config.json's feature extractor (ParakeetFeatureExtractor defaults where a key is absent) plus
    the Omni processor's own counting arguments."""

    feature_size: int = 80  # mel bins
    sampling_rate: int = 16000
    hop_length: int = 160
    n_fft: int = 512
    win_length: int = 400
    preemphasis: float | None = 0.97
    subsampling_factor: int = 8  # processor's audio_subsampling_factor
    count_hop: int = 160  # processor's audio_hop_length
    count_kernel: int = 3  # the processor never sets these two: its getattr defaults stand
    count_stride: int = 2

    @staticmethod
    def from_config(cfg: Mapping[str, Any]) -> AudioFeatureSpec:
        """The feature extractor's keys, top level or under `feature_extractor`; the processor's `audio_*` keys."""
        fe = {**cfg, **cfg.get("feature_extractor", {})}
        d = AudioFeatureSpec()
        pre = fe.get("preemphasis", d.preemphasis)
        return AudioFeatureSpec(
            int(fe.get("feature_size", d.feature_size)), int(fe.get("sampling_rate", d.sampling_rate)),
            int(fe.get("hop_length", d.hop_length)), int(fe.get("n_fft", d.n_fft)),
            int(fe.get("win_length", d.win_length)), None if pre is None else float(pre),
            int(cfg.get("audio_subsampling_factor", d.subsampling_factor)),
            int(cfg.get("audio_hop_length", d.count_hop)))


def token_count(num_samples: int, spec: AudioFeatureSpec) -> int:
    """<so_embedding> tokens for a waveform of num_samples (HF's _estimate_audio_num_embeddings): 1 + L // hop mel
    frames through log2(factor) stride-2 convs, at least 1."""
    n = 1 + num_samples // spec.count_hop
    pad = (spec.count_kernel - 1) // 2 * 2 - spec.count_kernel
    for _ in range(int(math.log2(spec.subsampling_factor))):
        n = (n + pad) // spec.count_stride + 1
    return max(1, n)


def placeholder(num_samples: int, spec: AudioFeatureSpec) -> str:
    """The text HF's processor puts where an audio placeholder was."""
    return AUDIO_START + AUDIO_TOKEN * token_count(num_samples, spec) + AUDIO_END


def mel_filters(spec: AudioFeatureSpec) -> Tensor:
    """Slaney-scale, Slaney-normalised triangles [mel, n_fft/2 + 1] over 0 .. sr/2: float64 maths (numpy's, as HF's
    mel_filter_bank), the triangles rounded to float32 before the normalisation, as HF rounds them."""
    n_freq, n_mel = spec.n_fft // 2 + 1, spec.feature_size
    mels = _linspace(_hz_to_mel(0.0), _hz_to_mel(spec.sampling_rate / 2), n_mel + 2)
    hz = _mel_to_hz(mels)  # [mel + 2] filter edges
    fft = _linspace(0.0, float(spec.sampling_rate // 2), n_freq)  # [n_freq]
    slopes = hz[None, :] - fft[:, None]  # [n_freq, mel + 2]
    width = np.diff(hz)
    tri = np.maximum(0.0, np.minimum(-slopes[:, :-2] / width[:-1], slopes[:, 2:] / width[1:])).astype(np.float32)
    tri = (tri * (2.0 / (hz[2:] - hz[:-2]))[None, :]).astype(np.float32)  # float32 * float64 -> float32
    return torch.from_numpy(np.ascontiguousarray(tri.T))


def _linspace(start: float, stop: float, n: int) -> np.ndarray:
    return np.linspace(start, stop, n)  # numpy's rounding of the steps (torch.linspace's differs in the last bit)


def _hz_to_mel(f: float) -> float:
    return 3.0 * f / 200.0 if f < 1000.0 else 15.0 + math.log(f / 1000.0) * (27.0 / math.log(6.4))


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    hz = 200.0 * m / 3.0
    log = m >= 15.0
    hz[log] = 1000.0 * np.exp(math.log(6.4) / 27.0 * (m[log] - 15.0))
    return hz


def log_mel(waves: Tensor, lengths: Tensor, spec: AudioFeatureSpec) -> tuple[Tensor, Tensor]:
    """Zero-padded float32 waveforms [B, L] with their lengths [B] -> normalised features [B, F, mel] (F = 1 + L//hop)
    and the valid-frame mask [B, F] (lengths // hop frames: the last frame is never valid)."""
    x = waves.float()
    if spec.preemphasis is not None:
        x = torch.cat([x[:, :1], x[:, 1:] - spec.preemphasis * x[:, :-1]], dim=1)
        x = x.masked_fill(torch.arange(x.shape[1], device=x.device) >= lengths[:, None], 0.0)
    window = torch.hann_window(spec.win_length, periodic=False, device=x.device)
    stft = torch.stft(x, spec.n_fft, hop_length=spec.hop_length, win_length=spec.win_length, window=window,
                      return_complex=True, pad_mode="constant")  # [B, n_freq, F]
    power = torch.view_as_real(stft).pow(2).sum(-1).sqrt().pow(2)  # |X|, then squared: HF's rounding
    mel = torch.log(mel_filters(spec).to(x.device) @ power + LOG_GUARD).transpose(1, 2)  # [B, F, mel]
    frames = (lengths + spec.n_fft // 2 * 2 - spec.n_fft) // spec.hop_length  # [B]
    mask = torch.arange(mel.shape[1], device=x.device)[None, :] < frames[:, None]  # [B, F]
    m = mask[..., None]
    masked = mel * m
    mean = (masked.sum(dim=1) / frames[:, None])[:, None]  # [B, 1, mel]
    var = ((masked - mean) ** 2 * m).sum(dim=1) / (frames - 1)[:, None]
    return (mel - mean) / (var.sqrt()[:, None] + STD_EPS) * m, mask


def audio_features(wave: Tensor, spec: AudioFeatureSpec) -> tuple[Tensor, int]:
    """One mono waveform [L] at spec.sampling_rate -> (features [1 + L//hop, mel], valid frames L//hop), as HF's
    extractor gives a clip alone (a clip padded beside longer ones has the same rows, zeros after)."""
    if wave.dim() != 1:
        raise MediaInvalidError(f"audio must be mono [samples], got shape {tuple(wave.shape)}")
    if wave.shape[0] < 2 * spec.hop_length:  # HF's normalisation divides by (frames - 1): NaN below 2 frames
        raise MediaInvalidError(f"audio of {wave.shape[0]} samples is shorter than 2 mel frames")
    feats, mask = log_mel(wave[None], torch.tensor([wave.shape[0]], device=wave.device), spec)
    return feats[0], int(mask.sum())


def decode_audio(data: bytes, sampling_rate: int = 16000) -> Tensor:
    """WAV / FLAC / MP3 / any FFmpeg audio bytes -> mono float32 [L] at sampling_rate. Samples convert to float as
    libsndfile does (int16 / 2^15), channels are averaged, another rate is resampled by FFmpeg's swresample and
    padded or cut to ceil(L * sr / src), as HF's soundfile backend sizes it."""
    import av

    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise MediaDecodeError("no audio stream in the media bytes")
            stream = container.streams.audio[0]
            to_float = av.AudioResampler(format="fltp")  # same layout and rate: a sample-format conversion only
            chunks = [f.to_ndarray() for frame in container.decode(stream) for f in to_float.resample(frame)]
            rate = stream.codec_context.sample_rate
    except av.error.FFmpegError as e:
        raise MediaDecodeError(f"undecodable audio: {e}") from e
    if not chunks:
        raise MediaDecodeError("audio stream has no samples")
    wave = np.concatenate(chunks, axis=1)  # [channels, L] float32
    mono = wave.mean(axis=0) if wave.shape[0] > 1 else wave[0]  # float32 mean over channels, as numpy's
    if rate != sampling_rate:
        mono = resample(mono, rate, sampling_rate)
    return torch.from_numpy(np.ascontiguousarray(mono, dtype=np.float32))


def resample(mono: np.ndarray, src: int, dst: int) -> np.ndarray:
    """FFmpeg's swresample at its defaults, padded or cut to ceil(L * dst / src)."""
    import av

    frame = av.AudioFrame.from_ndarray(mono[None, :].astype(np.float32), format="flt", layout="mono")
    frame.sample_rate = src
    resampler = av.AudioResampler(format="flt", layout="mono", rate=dst)
    out = [f.to_ndarray()[0] for f in resampler.resample(frame) + resampler.resample(None)]
    y = np.concatenate(out) if out else np.zeros(0, np.float32)
    n = math.ceil(mono.shape[0] * dst / src)
    return np.pad(y, (0, max(0, n - y.shape[0])))[:n]
