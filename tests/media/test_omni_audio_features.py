"""Nemotron Omni audio input against HF 5.24: log-mel features equal ParakeetFeatureExtractor's bit for bit (one clip
and a padded pair), <so_embedding> counts equal the Omni processor's, and WAV/FLAC/MP3 bytes decode to the waveform
HF's soundfile backend reads (16 kHz) or a close resampling of it (other rates)."""

from __future__ import annotations

import io
import math
import wave

import numpy as np
import pytest
import torch

from mm_infer.media.errors import MediaDecodeError, MediaInvalidError
from mm_infer.media.omni_audio import (
    AUDIO_END,
    AUDIO_START,
    AUDIO_TOKEN,
    AudioFeatureSpec,
    audio_features,
    decode_audio,
    log_mel,
    mel_filters,
    placeholder,
    token_count,
)

SR = 16000
# 1.0 s + 37 samples (100 valid frames), 0.64 s (64 frames: a multiple of 8, where HF's "+1" count matters), 0.2 s
CLIP_SAMPLES = (16037, 10245, 3200)


def sweep(n: int, rate: int = SR, f0: float = 150.0, f1: float = 3000.0) -> np.ndarray:
    """A linear sine sweep f0 -> f1 over n samples, int16 at half scale."""
    t = np.arange(n) / rate
    dur = n / rate
    return (0.5 * 32767 * np.sin(2 * np.pi * (f0 * t + (f1 - f0) * t * t / (2 * dur)))).astype(np.int16)


def wav_bytes(samples: np.ndarray, rate: int = SR) -> bytes:
    """int16 [n] or [n, channels] -> a PCM WAV file, written with the stdlib."""
    frames = samples.reshape(samples.shape[0], -1)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(frames.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames.astype("<i2").tobytes())
    return buf.getvalue()


def encoded(samples: np.ndarray, codec: str, fmt: str, rate: int = SR) -> bytes:
    """int16 mono [n] -> one audio stream in `fmt` with `codec`, encoded by PyAV."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        src = av.AudioFrame.from_ndarray(samples[None, :], format="s16", layout="mono")
        src.sample_rate = rate
        fit = av.AudioResampler(format=stream.codec_context.format.name, layout="mono", rate=rate)
        for frame in fit.resample(src) + fit.resample(None):
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


def clips() -> list[torch.Tensor]:
    """Real decoded audio: one sweep WAV, cut to the test lengths."""
    full = decode_audio(wav_bytes(sweep(max(CLIP_SAMPLES))))
    return [full[:n] for n in CLIP_SAMPLES]


def hf_extractor(spec: AudioFeatureSpec):
    from transformers import ParakeetFeatureExtractor

    return ParakeetFeatureExtractor(feature_size=spec.feature_size, sampling_rate=spec.sampling_rate,
                                    hop_length=spec.hop_length, n_fft=spec.n_fft, win_length=spec.win_length,
                                    preemphasis=spec.preemphasis)


@pytest.mark.parametrize("mel", [80, 128])
def test_mel_filters_equal_hf(mel):
    # catches: HTK instead of Slaney scale or norm, torch.linspace's rounding, the norm applied before float32
    spec = AudioFeatureSpec(feature_size=mel)
    assert torch.equal(mel_filters(spec), hf_extractor(spec).mel_filters)


@pytest.mark.parametrize("mel", [80, 128])
def test_one_clip_features_equal_hf(mel):
    # catches: preemphasis or window wrong, |X|^2 rounded differently, the last frame counted valid,
    # biased variance, eps inside the sqrt
    spec, fe = AudioFeatureSpec(feature_size=mel), hf_extractor(AudioFeatureSpec(feature_size=mel))
    for wave_ in clips():
        ref = fe([wave_.numpy()], sampling_rate=SR, return_tensors="pt")
        feats, length = audio_features(wave_, spec)
        assert feats.shape == ref.input_features[0].shape == (1 + wave_.shape[0] // 160, mel)
        assert length == int(ref.attention_mask.sum()) == wave_.shape[0] // 160
        assert (feats - ref.input_features[0]).abs().max().item() == 0.0  # bit-exact: the same torch ops


def test_padded_pair_features_equal_hf():
    # catches: preemphasis leaking into the padding, one clip's statistics over the other's frames
    spec = AudioFeatureSpec(feature_size=128)
    a, b = clips()[:2]
    ref = hf_extractor(spec)([a.numpy(), b.numpy()], sampling_rate=SR, return_tensors="pt")
    waves = torch.zeros(2, a.shape[0])
    waves[0], waves[1, :b.shape[0]] = a, b
    feats, mask = log_mel(waves, torch.tensor([a.shape[0], b.shape[0]]), spec)
    assert torch.equal(mask, ref.attention_mask)
    assert (feats - ref.input_features).abs().max().item() == 0.0
    alone, n = audio_features(b, spec)  # the short clip padded beside a longer one: same rows, zeros after
    assert torch.equal(feats[1, :alone.shape[0]], alone) and not feats[1, alone.shape[0]:].any()


def hf_processor(monkeypatch):
    """HF's Omni processor with a Parakeet extractor. Its class check wants the torchvision image processor, absent
    here, so the check is skipped; the audio path never touches the image or video processor."""
    from transformers import ParakeetFeatureExtractor, PreTrainedTokenizerFast
    from transformers.models.nemotron_h_omni.processing_nemotron_h_omni import NemotronH_Omni_Reasoning_V3Processor
    from transformers.processing_utils import ProcessorMixin

    from tests.models.nemotron_omni_cases import OMNI

    tok = PreTrainedTokenizerFast(tokenizer_file=str(OMNI / "tokenizer.json"))
    tok.add_special_tokens({"additional_special_tokens": [AUDIO_START, AUDIO_TOKEN, AUDIO_END]})
    monkeypatch.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None)
    return NemotronH_Omni_Reasoning_V3Processor(image_processor=None, video_processor=None, tokenizer=tok,
                                                feature_extractor=ParakeetFeatureExtractor(feature_size=128))


def test_token_counts_equal_processor(monkeypatch):
    # catches: counting L // hop frames (vLLM's rule, one short when L // hop % 8 == 0), a floor/ceil slip, max(1, n)
    proc = hf_processor(monkeypatch)
    spec = AudioFeatureSpec(feature_size=128)
    for n in [*range(0, 3000, 7), *range(1270, 1300), 10240, 10245, 16037, 16000 * 30 + 1]:
        assert token_count(n, spec) == max(1, proc._estimate_audio_num_embeddings(n)), n
    vllm_rule = [math.ceil(n // 160 / 8) for n in CLIP_SAMPLES]  # sub(L // hop): no +1
    assert [token_count(n, spec) for n in CLIP_SAMPLES] != vllm_rule


def test_expanded_prompt_equals_processor(monkeypatch):
    # catches: start/end tokens missing or swapped, the counts of two clips exchanged, features not HF's
    proc = hf_processor(monkeypatch)
    a, b = clips()[:2]
    out = proc(text=["hear <so_embedding> then <so_embedding>."], audio=[a.numpy(), b.numpy()], return_tensors="pt")
    spec = AudioFeatureSpec.from_config({"feature_extractor": {"feature_size": 128}})
    mine = f"hear {placeholder(a.shape[0], spec)} then {placeholder(b.shape[0], spec)}."
    assert proc.tokenizer(mine)["input_ids"] == out["input_ids"][0].tolist()
    assert torch.equal(out["input_features_mask"].sum(-1), torch.tensor([a.shape[0] // 160, b.shape[0] // 160]))


def test_wav_decodes_exactly():
    # catches: int16 scaled by 32767, channels interleaved into time, stereo taken from one channel
    mono = sweep(24000)
    assert torch.equal(decode_audio(wav_bytes(mono)), torch.from_numpy(mono.astype(np.float32) / 32768))
    stereo = np.stack([mono, mono // 3], axis=1)
    want = (stereo.T.astype(np.float32) / 32768).mean(axis=0)  # HF soundfile backend: float32, channels averaged
    assert torch.equal(decode_audio(wav_bytes(stereo)), torch.from_numpy(want))


def test_flac_and_mp3_decode():
    # catches: a container other than WAV refused or decoded at the wrong rate; FLAC is lossless, so exact
    mono = sweep(16000)
    assert torch.equal(decode_audio(encoded(mono, "flac", "flac")), decode_audio(wav_bytes(mono)))
    mp3 = decode_audio(encoded(mono, "libmp3lame", "mp3"))  # lossy, with the encoder's priming: close, not equal
    assert abs(mp3.shape[0] - mono.shape[0]) <= 2 * 1152
    ref = torch.from_numpy(mono.astype(np.float32) / 32768)
    n = min(mp3.shape[0], ref.shape[0])
    best = max(float(torch.nn.functional.cosine_similarity(mp3[s:s + n - 2400], ref[:n - 2400], dim=0))
               for s in range(0, 2400))
    assert best > 0.95


@pytest.mark.parametrize("rate", [8000, 22050, 44100, 48000])
def test_resampled_length_and_signal(rate):
    # catches: the source rate kept, a delay from the resampler, the length not ceil(L * 16000 / rate)
    n = int(1.5 * rate)
    tone = (0.5 * 32767 * np.sin(2 * np.pi * 440 * np.arange(n) / rate)).astype(np.int16)
    got = decode_audio(wav_bytes(tone, rate)).numpy()
    assert got.shape == (math.ceil(n * SR / rate),)
    want = 0.5 * np.sin(2 * np.pi * 440 * np.arange(got.shape[0]) / SR)
    assert np.abs(got - want)[400:-400].max() < 1e-3  # FFmpeg's swresample, not soxr: close, not bit-equal


def test_bad_audio_refused():
    # catches: garbage bytes or a too-short clip reaching the extractor (HF's normalisation yields NaN there)
    with pytest.raises(MediaDecodeError):
        decode_audio(b"RIFF\x00\x00not audio at all" * 4)
    with pytest.raises(MediaInvalidError):
        audio_features(torch.zeros(319), AudioFeatureSpec())
    assert torch.isfinite(audio_features(torch.zeros(320), AudioFeatureSpec())[0]).all()
