"""Frozen model config dataclasses parsed from an HF Qwen2-VL / Qwen2.5-VL / Qwen3-VL (MoE) config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mm_infer.models.errors import UnknownArchitectureError, UnsupportedConfigError

ARCHITECTURES = {
    "Qwen2VLForConditionalGeneration": "qwen2_vl",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe",
}
QWEN3 = ("qwen3_vl", "qwen3_vl_moe")


@dataclass(frozen=True)
class VisionConfig:
    kind: str  # "qwen2_vl" (LayerNorm + QuickGELU MLP), "qwen2_5_vl" (RMSNorm + SwiGLU, windows), "qwen3_vl"
    depth: int
    embed_dim: int  # width of the vision blocks
    num_heads: int
    mlp_hidden: int
    hidden_act: str
    out_dim: int  # merger output = LM hidden size
    patch_size: int = 14
    temporal_patch_size: int = 2
    in_channels: int = 3
    spatial_merge_size: int = 2
    rope_theta: float = 10000.0
    window_size: int = 0  # 2.5 only
    fullatt_block_indexes: tuple[int, ...] = ()  # 2.5 only
    tokens_per_second: int | None = None  # 2.5 only
    num_position_embeddings: int = 0  # 3 only: learned square position grid, interpolated per item
    deepstack_visual_indexes: tuple[int, ...] = ()  # 3 only: blocks whose merged features feed the first LM layers

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.in_channels * self.temporal_patch_size * self.patch_size**2


@dataclass(frozen=True)
class TextConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, int, int]
    hidden_act: str = "silu"
    attention_bias: bool = True  # q/k/v biases (Qwen2); Qwen3 has none
    qk_norm: bool = False  # Qwen3: RMSNorm over each q and k head before the rotary
    mrope_interleaved: bool = False  # Qwen3-VL: frequencies cycle t, h, w instead of contiguous sections
    head_dim_override: int | None = None  # Qwen3 configs name head_dim (may differ from hidden / heads)
    moe: MoEConfig | None = None

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden_size // self.num_heads


@dataclass(frozen=True)
class MoEConfig:
    """Qwen3-VL-MoE sparse MLP: softmax router, top-k renormalised, experts fused per layer."""

    num_experts: int
    top_k: int
    intermediate_size: int
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def is_sparse(self, layer: int) -> bool:
        """HF's rule for which decoder layers hold a sparse MLP."""
        return (layer not in self.mlp_only_layers and self.num_experts > 0
                and (layer + 1) % self.decoder_sparse_step == 0)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    kind: str
    text: TextConfig
    vision: VisionConfig
    tie_word_embeddings: bool
    image_token_id: int
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
    eos_token_id: int | tuple[int, ...] | None


def _moe_config(t: dict[str, Any]) -> MoEConfig | None:
    experts = t.get("num_experts") or t.get("num_local_experts")  # transformers 5 saves the latter name
    if not experts:
        return None
    return MoEConfig(experts, t["num_experts_per_tok"], t["moe_intermediate_size"],
                     t.get("decoder_sparse_step", 1), tuple(t.get("mlp_only_layers") or ()))


def _text_config(raw: dict[str, Any], kind: str) -> TextConfig:
    t = raw.get("text_config") or raw
    qwen3 = kind in QWEN3
    rope = t.get("rope_parameters") or t.get("rope_scaling") or raw.get("rope_scaling") or {}
    theta = rope.get("rope_theta", t.get("rope_theta", raw.get("rope_theta", 500000.0 if qwen3 else 1000000.0)))
    section = tuple(rope.get("mrope_section", (24, 20, 20) if qwen3 else (16, 24, 24)))
    if qwen3 and rope.get("mrope_interleaved") is False:  # HF's Qwen3-VL always interleaves
        raise UnsupportedConfigError("Qwen3-VL with mrope_interleaved=false is not supported")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise UnsupportedConfigError(f"rope_type {rope_type!r} is not supported (only plain M-RoPE)")
    if t.get("use_sliding_window"):
        raise UnsupportedConfigError("use_sliding_window=true is not supported")
    heads = t["num_attention_heads"]
    cfg = TextConfig(
        vocab_size=t["vocab_size"],
        hidden_size=t["hidden_size"],
        intermediate_size=t["intermediate_size"],
        num_layers=t["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=t.get("num_key_value_heads") or heads,
        rms_norm_eps=t.get("rms_norm_eps", 1e-6),
        rope_theta=float(theta),
        mrope_section=section,  # type: ignore[arg-type]
        hidden_act=t.get("hidden_act", "silu"),
        attention_bias=bool(t.get("attention_bias", False)) if qwen3 else True,
        qk_norm=qwen3,
        mrope_interleaved=qwen3,
        head_dim_override=t.get("head_dim", 128) if qwen3 else None,
        moe=_moe_config(t) if kind == "qwen3_vl_moe" else None,
    )
    if 2 * sum(cfg.mrope_section) != cfg.head_dim:
        raise ValueError(f"mrope_section {cfg.mrope_section} does not cover head_dim {cfg.head_dim}")
    return cfg


def _vision_config(kind: str, v: dict[str, Any], text_hidden: int) -> VisionConfig:
    kind = "qwen3_vl" if kind in QWEN3 else kind  # one vision tower for dense and MoE
    common = dict(
        kind=kind,
        depth=v["depth"],
        num_heads=v["num_heads"],
        patch_size=v.get("patch_size", 16 if kind == "qwen3_vl" else 14),
        temporal_patch_size=v.get("temporal_patch_size", 2),
        in_channels=v.get("in_channels", v.get("in_chans", 3)),
        spatial_merge_size=v.get("spatial_merge_size", 2),
        rope_theta=float((v.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
    )
    if kind == "qwen2_vl":
        embed = v["embed_dim"]
        return VisionConfig(
            embed_dim=embed,
            mlp_hidden=int(embed * v.get("mlp_ratio", 4)),
            hidden_act=v.get("hidden_act", "quick_gelu"),
            out_dim=v.get("hidden_size", text_hidden),
            **common,
        )
    extra: dict[str, Any] = (
        dict(num_position_embeddings=v.get("num_position_embeddings", 2304),
             deepstack_visual_indexes=tuple(v.get("deepstack_visual_indexes", (8, 16, 24))))
        if kind == "qwen3_vl" else
        dict(window_size=v.get("window_size", 112),
             fullatt_block_indexes=tuple(v.get("fullatt_block_indexes", (7, 15, 23, 31))),
             tokens_per_second=v.get("tokens_per_second", 4)))
    return VisionConfig(
        embed_dim=v["hidden_size"],
        mlp_hidden=v["intermediate_size"],
        hidden_act=v.get("hidden_act", "gelu_pytorch_tanh" if kind == "qwen3_vl" else "silu"),
        out_dim=v.get("out_hidden_size", text_hidden),
        **extra,
        **common,
    )


def parse_config(raw: dict[str, Any]) -> ModelConfig:
    """Turn an HF config.json dict (flat legacy or nested text_config layout) into a ModelConfig."""
    archs = raw.get("architectures") or []
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        by_type = {v: k for k, v in ARCHITECTURES.items()}
        if raw.get("model_type") not in by_type:
            raise UnknownArchitectureError(
                f"unknown architecture {archs or raw.get('model_type')!r}; supported: {sorted(ARCHITECTURES)}"
            )
        arch = by_type[raw["model_type"]]
    kind = ARCHITECTURES[arch]
    text = _text_config(raw, kind)
    t = raw.get("text_config") or {}
    tie = bool(raw.get("tie_word_embeddings", False) or t.get("tie_word_embeddings", False))
    eos = t.get("eos_token_id", raw.get("eos_token_id"))
    return ModelConfig(
        architecture=arch,
        kind=kind,
        text=text,
        vision=_vision_config(kind, raw["vision_config"], text.hidden_size),
        tie_word_embeddings=tie,
        image_token_id=raw.get("image_token_id", 151655),
        video_token_id=raw.get("video_token_id", 151656),
        vision_start_token_id=raw.get("vision_start_token_id", 151652),
        vision_end_token_id=raw.get("vision_end_token_id", 151653),
        eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
    )


def load_config(model_dir: str | Path) -> ModelConfig:
    return parse_config(json.loads((Path(model_dir) / "config.json").read_text()))
