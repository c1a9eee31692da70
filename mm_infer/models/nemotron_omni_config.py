"""Nemotron Omni's config.json (HF `nemotron_h_omni`, released or transformers names) -> the `omni` section of its
ModelConfig (the hybrid LM, the RADIO tower, the projector, the audio tower), with HF 5.24's legacy-name rules and our
refusals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mm_infer.models.errors import UnsupportedConfigError
from mm_infer.models.nemotron_h import NemotronHConfig
from mm_infer.models.parakeet import AudioEncoderConfig
from mm_infer.models.radio import RadioConfig

ARCHITECTURES = {"NemotronH_Omni_Reasoning_V3": "nemotron_h_omni"}
RELEASED_CUSTOM = "NemotronH_Nano_Omni_Reasoning_V3"  # the hub's custom-code form (vLLM's nano_nemotron_vl)
LEGACY = {"img_context_token_id": "image_token_id", "video_context_token_id": "video_token_id",
          "sound_context_token_id": "audio_token_id", "llm_config": "text_config", "sound_config": "audio_config",
          "vit_hidden_size": "vision_hidden_size"}  # HF's __post_init__: the legacy value when the new one is unset
RADIO_DEFAULTS = dict(hidden_size=1280, num_hidden_layers=32, num_attention_heads=16, mlp_ratio=4.0, patch_size=16,
                      max_img_size=2048, num_cls_tokens=3, num_registers=7, layer_norm_eps=1e-6, qkv_bias=True,
                      hidden_act="gelu", use_swiglu_ffn=False, num_channels=3, video_temporal_patch_size=None)


@dataclass(frozen=True)
class OmniConfig:
    lm: NemotronHConfig
    radio: RadioConfig
    projector_hidden: int
    final_norm: bool  # vision_final_layernorm exists iff the LM declares MTP layers (HF's rule)
    video_pruning_rate: float  # EVS; requests with video are refused while it is > 0
    image_start_token_id: int | None
    image_end_token_id: int | None
    audio: AudioEncoderConfig | None = None  # the Parakeet audio tower and its projector, when audio_config is set
    audio_token_id: int | None = None


def _resolved(raw: dict[str, Any]) -> dict[str, Any]:
    out = dict(raw)
    for old, new in LEGACY.items():
        if out.get(new) is None and old in out:
            out[new] = out[old]
    return out


def _radio(v: dict[str, Any], temporal: int) -> RadioConfig:
    v = {**RADIO_DEFAULTS, **v}
    if v["use_swiglu_ffn"] or v["hidden_act"] != "gelu" or v["num_channels"] != 3:
        raise UnsupportedConfigError("radio vision_config: only the gelu MLP over 3 channels is supported "
                                     f"(use_swiglu_ffn={v['use_swiglu_ffn']}, hidden_act={v['hidden_act']!r})")
    if v["video_temporal_patch_size"] != temporal:
        raise UnsupportedConfigError(f"vision_config.video_temporal_patch_size {v['video_temporal_patch_size']} "
                                     f"differs from video_temporal_patch_size {temporal} (transformers refuses it)")
    return RadioConfig(v["hidden_size"], v["num_hidden_layers"], v["num_attention_heads"],
                       int(v["hidden_size"] * v["mlp_ratio"]), v["patch_size"], v["max_img_size"],
                       v["num_cls_tokens"] + v["num_registers"], v["layer_norm_eps"], bool(v["qkv_bias"]), 3, temporal)


def _audio(raw: dict[str, Any]) -> AudioEncoderConfig | None:
    """The audio tower's config (HF drops a nested `model_type`), or None without one."""
    audio = raw.get("audio_config")
    if audio is None:
        return None
    try:
        return AudioEncoderConfig.from_hf({k: v for k, v in audio.items() if k != "model_type"})
    except ValueError as exc:
        raise UnsupportedConfigError(f"nemotron_h_omni audio_config: {exc}") from exc


def _refusals(raw: dict[str, Any], text: dict[str, Any]) -> None:
    if raw.get("downsample_ratio", 0.5) != 0.5:
        raise UnsupportedConfigError(f"downsample_ratio {raw['downsample_ratio']} is not supported (only 0.5, as "
                                     "transformers' token count assumes)")
    if text.get("mlp_hidden_act", "relu2") != "relu2" or text.get("mamba_hidden_act", "silu") != "silu":
        raise UnsupportedConfigError("nemotron_h: only relu2 MLPs and silu Mamba activations are supported")
    if text.get("moe_latent_size") is not None:
        raise UnsupportedConfigError("nemotron_h moe_latent_size (latent MoE projections) is not supported")


def omni_section(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], OmniConfig]:
    """A `nemotron_h_omni` config dict -> (the dict with HF's legacy names resolved, its text section, the Omni
    section), refusing what we cannot run exactly; config.py builds the ModelConfig around them."""
    raw = _resolved(raw)
    t = dict(raw.get("text_config") or {})
    _refusals(raw, t)
    lm = NemotronHConfig.from_hf(t)
    temporal = int(raw.get("video_temporal_patch_size", 2))
    radio = _radio(dict(raw.get("vision_config") or {}), temporal)
    if raw.get("vision_hidden_size", radio.hidden) != radio.hidden:
        raise UnsupportedConfigError(f"vision_hidden_size {raw['vision_hidden_size']} differs from the tower's "
                                     f"hidden_size {radio.hidden}")
    if raw.get("image_token_id") is None:
        raise UnsupportedConfigError("nemotron_h_omni config names no image_token_id (img_context_token_id)")
    omni = OmniConfig(lm, radio, int(raw.get("projector_hidden_size", 4096)),
                      int(t.get("num_nextn_predict_layers", 0)) > 0, float(raw.get("video_pruning_rate", 0.0)),
                      raw.get("image_start_token_id"), raw.get("image_end_token_id"), _audio(raw),
                      raw.get("audio_token_id"))
    return raw, t, omni
