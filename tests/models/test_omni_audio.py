"""Nemotron Omni's audio path (Parakeet encoder + projector) against HF's get_audio_features in float32, on a tiny
random omni model with every audio parameter and batch-norm statistic randomised: clips alone and padded together,
the rows kept per clip, the checkpoint names, and ablations that must break the match."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mm_infer.media.omni_audio import AudioFeatureSpec, audio_features, log_mel, token_count
from mm_infer.models import parakeet
from mm_infer.models.parakeet import AudioEncoderConfig, OmniAudio, omni_audio_name
from tests.media.test_omni_audio_features import CLIP_SAMPLES, clips
from tests.models.test_nemotron_omni_vision import TEXT, VISION

TOL = 1e-4
# the released layout: no model_type (HF's quirk, docs/dev/nemotron-omni-hf-reading.md 1.1), the legacy key name;
# odd mel count / subsampling checks the frequency axis, projection_bias the biased projector
AUDIO = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48,
         "num_mel_bins": 128, "subsampling_conv_channels": 8, "conv_kernel_size": 9, "subsampling_factor": 8,
         "projection_hidden_size": 40, "projection_bias": True}
SPEC = AudioFeatureSpec(feature_size=128)


@pytest.fixture(scope="module")
def hf():
    from transformers import AutoModelForImageTextToText
    from transformers.models.nemotron_h_omni.configuration_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3_Config,
    )

    cfg = NemotronH_Omni_Reasoning_V3_Config(
        downsample_ratio=0.5, projector_hidden_size=48, vision_hidden_size=32, video_temporal_patch_size=2,
        img_context_token_id=10, sound_context_token_id=11, llm_config=TEXT, vision_config=VISION,
        sound_config=AUDIO)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(cfg).float().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # HF's init leaves zero biases, unit norms, identity batch-norm stats: move them all
        for name, p in model.named_parameters():
            if name.startswith(("audio_tower.", "embed_audio.")):
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
        for m in model.audio_tower.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.copy_(0.5 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.5 + 1.5 * torch.rand(m.running_var.shape, generator=gen))
    return model


@pytest.fixture
def ours(hf) -> OmniAudio:
    model = OmniAudio(AudioEncoderConfig.from_hf(AUDIO), text_hidden=TEXT["hidden_size"]).float().eval()
    audio = ("audio_tower.", "embed_audio.")
    state = {omni_audio_name(k): v for k, v in hf.state_dict().items() if k.startswith(audio)}
    model.load_state_dict(state, strict=True)  # every parameter and buffer named, nothing left over
    return model


def hf_rows(hf, waves: list[torch.Tensor]) -> torch.Tensor:
    """HF's processor features for these clips padded together, through get_audio_features."""
    from transformers import ParakeetFeatureExtractor

    fe = ParakeetFeatureExtractor(feature_size=SPEC.feature_size)(
        [w.numpy() for w in waves], sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        return hf.get_audio_features(fe.input_features, fe.attention_mask).pooler_output


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float("inf") if a.shape != b.shape else (a - b).abs().max().item()


def test_name_map():
    # catches: the released names (sound_encoder.encoder.*, sound_projection.*) not reaching our modules
    bn = "layers.3.conv.norm.running_var"
    assert omni_audio_name(f"sound_encoder.encoder.{bn}") == f"encoder.{bn}"
    assert omni_audio_name("sound_projection.linear1.weight") == "projector.linear_1.weight"
    assert omni_audio_name("sound_projection.norm.weight") == "projector.layer_norm.weight"
    assert omni_audio_name("model.embed_audio.linear_2.bias") == "projector.linear_2.bias"
    assert omni_audio_name("sound_encoder.encoder.feature_extractor.featurizer.fb") is None
    assert omni_audio_name("language_model.lm_head.weight") == "language_model.lm_head.weight"  # not ours


def test_config_defaults_follow_omni():
    # catches: ParakeetEncoderConfig's own defaults (bias, sqrt(d) input scale) taken where Omni's config sets False
    cfg = AudioEncoderConfig.from_hf({"projection_hidden_size": 8})
    assert not cfg.attention_bias and not cfg.scale_input and cfg.conv_bias and cfg.sub_factor == 8


@pytest.mark.parametrize("index", range(len(CLIP_SAMPLES)), ids=[f"{n}-samples" for n in CLIP_SAMPLES])
@torch.no_grad()
def test_one_clip_equals_hf(hf, ours, record, index):
    # catches: subsampling masks, rel-pos attention, the conv module, half-step residuals, the +1 trim, projector
    wave = clips()[index]
    feats, length = audio_features(wave, SPEC)
    mine, theirs = ours(feats, length), hf_rows(hf, [wave])
    assert mine.shape[0] == ours.tokens(length) == token_count(wave.shape[0], SPEC)
    assert record(f"omni audio one clip {wave.shape[0]}", diff(mine, theirs)) <= TOL


@torch.no_grad()
def test_padded_clips_equal_hf(hf, ours, record):
    # catches: one clip's frames leaking into the other's attention or conv, rows trimmed per batch not per clip
    waves = clips()
    lengths = torch.tensor([w.shape[0] for w in waves])
    padded = torch.zeros(len(waves), int(lengths.max()))
    for i, w in enumerate(waves):
        padded[i, :w.shape[0]] = w
    feats, mask = log_mel(padded, lengths, SPEC)
    mine, theirs = ours.forward_batch(feats, mask.sum(-1).tolist()), hf_rows(hf, waves)
    assert mine.shape[0] == sum(token_count(n, SPEC) for n in CLIP_SAMPLES)
    assert record("omni audio padded clips", diff(mine, theirs)) <= TOL


@torch.no_grad()
def test_hf_padding_row_depends_on_the_batch(hf, ours):
    # documents HF's quirk the two entry points follow: a clip of length % 8 == 0 keeps a last row the encoder masked
    # (it attends evenly over all keys, padding included), so HF's value for it depends on what the clip is padded
    # beside; forward() is HF's clip alone, forward_batch() HF's clips padded together
    long, short = clips()[0], clips()[1]  # 64 valid frames: 9 rows kept, the 9th masked in the encoder
    n = token_count(short.shape[0], SPEC)
    alone, together = hf_rows(hf, [short]), hf_rows(hf, [long, short])[-n:]
    assert diff(alone[:-1], together[:-1]) <= TOL and diff(alone[-1:], together[-1:]) > 1e-3
    assert diff(ours(*audio_features(short, SPEC)), alone) <= TOL


def wrong_length_rule(lengths, kernel, stride):  # no 'same' padding: (L - k) // s + 1
    return (lengths - kernel) // stride + 1


def off_by_one(t, device):
    ar = torch.arange(t, device=device)
    return ((t - 1) - ar[:, None] + ar[None, :] + 1).clamp(max=2 * t - 2)


def batch_stats(x, mean, var, weight, bias, training, eps, _bn=F.batch_norm):
    return _bn(x, None, None, weight, bias, True, 0.1, eps)


@pytest.mark.parametrize("target,attr,fake", [
    (parakeet, "conv_length", wrong_length_rule),
    (parakeet, "rel_index", off_by_one),
    (parakeet.F, "batch_norm", batch_stats),
], ids=["subsampling-length-rule", "rel-shift-off-by-one", "batch-norm-train-mode"])
@torch.no_grad()
def test_ablations_break_the_match(hf, ours, monkeypatch, target, attr, fake):
    # the tests above can fail: each known-wrong variant moves the padded-pair output off HF's by far more than TOL
    waves = clips()[:2]
    theirs = hf_rows(hf, waves)  # before the patch: HF's BatchNorm1d calls F.batch_norm too
    lengths = torch.tensor([w.shape[0] for w in waves])
    padded = torch.zeros(2, int(lengths.max()))
    for i, w in enumerate(waves):
        padded[i, :w.shape[0]] = w
    feats, mask = log_mel(padded, lengths, SPEC)
    monkeypatch.setattr(target, attr, fake)
    assert diff(ours.forward_batch(feats, mask.sum(-1).tolist()), theirs) > 1e-2


@torch.no_grad()
def test_trim_without_plus_one_breaks_the_match(hf, ours):
    # catches: trimming to the encoder's own valid length (vLLM's rule) drops HF's last row for 64 valid frames
    wave = clips()[1]
    feats, length = audio_features(wave, SPEC)
    hidden = ours.projector(ours.encoder(feats[None], torch.tensor([length])))[0]
    kept = parakeet.subsampled_length(length, ours.cfg)
    assert diff(hidden[:kept], hf_rows(hf, [wave])) == float("inf")


def test_a_checkpoint_with_an_audio_tower_loads_exactly_and_its_audio_equals_hf(hf, tmp_path):
    # catches: an Omni checkpoint with audio refused (the released model has one), an audio tensor of the hub's
    # layout (sound_encoder.*, sound_projection.*) or a batch-norm statistic not loaded, the featurizer not skipped
    from safetensors.torch import load_file

    from mm_infer.models.loader import load_model

    hf.save_pretrained(tmp_path)  # transformers writes the hub's names back
    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert any(n.startswith("sound_encoder.") for n in names) and any("running_var" in n for n in names)
    model, config = load_model(tmp_path)  # strict: every parameter and buffer filled, every tensor used
    assert config.omni.audio is not None and model.audio is not None
    waves = clips()
    spec = SPEC
    for wave in waves:
        features, length = audio_features(wave, spec)
        with torch.no_grad():
            got = model.audio(features, length)
        assert got.shape[0] == token_count(wave.numel(), spec)
        assert diff(got, hf_rows(hf, [wave])) <= TOL
