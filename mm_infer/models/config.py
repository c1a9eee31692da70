"""Frozen model config dataclasses parsed from an HF Qwen2-VL / Qwen2.5-VL / Qwen3-VL (MoE) or Nemotron Omni
config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mm_infer.models import nemotron_omni_config as omni
from mm_infer.models import qwen35_config as q35
from mm_infer.models.errors import UnknownArchitectureError, UnsupportedConfigError

if TYPE_CHECKING:
    from mm_infer.models.nemotron_omni_config import OmniConfig
    from mm_infer.models.qwen35_config import Qwen35Config

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
    omni: OmniConfig | None = None  # Nemotron Omni: the hybrid LM, RADIO tower and projector (text/vision summarise)
    qwen35: Qwen35Config | None = None  # Qwen3.5: the layer pattern and gated DeltaNet dims


# transformers 5.24's class defaults for the fields we read, by family (configuration_<family>.py): a nested
# text_config or vision_config that leaves a field out gets these, never another section's value
_QWEN2_TEXT = dict(vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
                   num_attention_heads=64, num_key_value_heads=8, hidden_act="silu", rms_norm_eps=1e-5,
                   use_sliding_window=False, eos_token_id=151645)
TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen2_vl": _QWEN2_TEXT,
    "qwen2_5_vl": _QWEN2_TEXT,
    "qwen3_vl": dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=32, head_dim=128, hidden_act="silu",
                     rms_norm_eps=1e-6, attention_bias=False),
    "qwen3_vl_moe": dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                         num_attention_heads=16, num_key_value_heads=16, head_dim=None, hidden_act="silu",
                         rms_norm_eps=1e-6, attention_bias=False, decoder_sparse_step=1, moe_intermediate_size=1408,
                         num_experts_per_tok=4, num_experts=60, mlp_only_layers=None, eos_token_id=None),
}
ROPE_DEFAULTS = {  # (default_theta, the rotary's mrope_section when the rope dict names none)
    "qwen2_vl": (1000000.0, (16, 24, 24)), "qwen2_5_vl": (1000000.0, (16, 24, 24)),
    "qwen3_vl": (500000.0, (24, 20, 20)), "qwen3_vl_moe": (500000.0, (24, 20, 20)),
}
VISION_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen2_vl": dict(depth=32, embed_dim=1280, hidden_size=3584, hidden_act="quick_gelu", mlp_ratio=4, num_heads=16,
                     in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
    "qwen2_5_vl": dict(depth=32, hidden_size=3584, hidden_act="silu", intermediate_size=3420, num_heads=16,
                       in_channels=3, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, tokens_per_second=4,
                       window_size=112, out_hidden_size=3584, fullatt_block_indexes=(7, 15, 23, 31)),
    "qwen3_vl": dict(depth=27, hidden_size=1152, hidden_act="gelu_pytorch_tanh", intermediate_size=4304, num_heads=16,
                     in_channels=3, patch_size=16, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=3584,
                     num_position_embeddings=2304, deepstack_visual_indexes=(8, 16, 24)),
}
VISION_THETA = 10000.0  # PreTrainedConfig.default_theta: the vision configs set none of their own
TOKEN_IDS = dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                 vision_end_token_id=151653)  # top-level fields of every family's composite config


def _typed(section: dict[str, Any], key: str, default: Any, kind: type, where: str) -> Any:
    """section[key] (default when absent), refused as transformers' strict dataclass fields refuse a wrong type."""
    value = section.get(key, default)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise UnsupportedConfigError(f"{where}{key} is {value!r}; transformers requires a {kind.__name__}")
    return value


def _text_section(raw: dict[str, Any], kind: str) -> tuple[dict[str, Any], bool]:
    """(the text fields with the family's defaults filled in, whether they came from a nested text_config).

    Qwen2/2.5-VL read a flat legacy config's top-level text fields when text_config is absent or null; Qwen3-VL
    (+MoE) then build their default text model. A nested text_config (even {}) is read alone.
    """
    nested = raw.get("text_config")
    if nested is None and kind not in QWEN3:
        return {**TEXT_DEFAULTS[kind], **raw}, False
    return {**TEXT_DEFAULTS[kind], **(nested or {})}, True


def _moe_config(t: dict[str, Any]) -> MoEConfig | None:
    experts = t.get("num_local_experts", t["num_experts"])  # transformers 5 saves num_experts under this name
    if not experts:
        return None
    return MoEConfig(experts, t["num_experts_per_tok"], t["moe_intermediate_size"],
                     t["decoder_sparse_step"], tuple(t["mlp_only_layers"] or ()))


def _text_rope(t: dict[str, Any], kind: str) -> tuple[float, tuple[int, int, int]]:
    """(rope_theta, mrope_section) as the text config's convert_rope_params_to_dict and rotary resolve them.

    rope_scaling wins over rope_parameters; the dict's rope_theta over a rope_theta field over default_theta.
    Top-level rope fields beside a nested text_config are not read (transformers ignores them too).
    """
    rope = t.get("rope_scaling") or t.get("rope_parameters") or {}
    default_theta, default_section = ROPE_DEFAULTS[kind]
    theta = rope["rope_theta"] if "rope_theta" in rope else t.get("rope_theta", default_theta)
    if not isinstance(theta, (int, float)) or isinstance(theta, bool):
        raise UnsupportedConfigError(f"text rope_theta is {theta!r}; transformers needs a number")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if kind not in QWEN3 and rope_type == "mrope":
        rope_type = "default"  # Qwen2VLTextConfig's rename; Qwen3-VL's rotary has no "mrope" type (KeyError)
    if rope_type != "default":
        raise UnsupportedConfigError(f"rope_type {rope_type!r} is not supported (only plain M-RoPE)")
    if kind in QWEN3 and rope.get("mrope_interleaved") is False:  # HF's Qwen3-VL always interleaves
        raise UnsupportedConfigError("Qwen3-VL with mrope_interleaved=false is not supported")
    return float(theta), tuple(rope.get("mrope_section", default_section))  # type: ignore[return-value]


def _text_config(raw: dict[str, Any], kind: str) -> TextConfig:
    t, _ = _text_section(raw, kind)
    qwen3 = kind in QWEN3
    theta, section = _text_rope(t, kind)
    if t.get("use_sliding_window"):
        raise UnsupportedConfigError("use_sliding_window=true is not supported")
    heads = t["num_attention_heads"]
    cfg = TextConfig(
        vocab_size=t["vocab_size"],
        hidden_size=t["hidden_size"],
        intermediate_size=t["intermediate_size"],
        num_layers=t["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=t["num_key_value_heads"] or heads,  # an explicit null means one kv head per head
        rms_norm_eps=t["rms_norm_eps"],
        rope_theta=theta,
        mrope_section=section,
        hidden_act=t["hidden_act"],
        attention_bias=bool(t["attention_bias"]) if qwen3 else True,
        qk_norm=qwen3,
        mrope_interleaved=qwen3,
        head_dim_override=(t["head_dim"] or t["hidden_size"] // heads) if qwen3 else None,
        moe=_moe_config(t) if kind == "qwen3_vl_moe" else None,
    )
    if 2 * sum(cfg.mrope_section) != cfg.head_dim:
        raise UnsupportedConfigError(f"mrope_section {cfg.mrope_section} does not cover head_dim {cfg.head_dim}")
    return cfg


def _vision_theta(v: dict[str, Any]) -> float:
    rope = v.get("rope_scaling") or v.get("rope_parameters") or {}
    theta = rope["rope_theta"] if "rope_theta" in rope else v.get("rope_theta", VISION_THETA)
    if not isinstance(theta, (int, float)) or isinstance(theta, bool):
        raise UnsupportedConfigError(f"vision_config rope_theta is {theta!r}; transformers needs a number")
    return float(theta)


def _vision_config(kind: str, raw_vision: dict[str, Any] | None) -> VisionConfig:
    kind = "qwen3_vl" if kind in QWEN3 else kind  # one vision tower for dense and MoE
    v = {**VISION_DEFAULTS[kind], **(raw_vision or {})}
    common = dict(kind=kind, depth=v["depth"], num_heads=v["num_heads"], patch_size=v["patch_size"],
                  temporal_patch_size=v["temporal_patch_size"], in_channels=v["in_channels"],
                  spatial_merge_size=v["spatial_merge_size"], rope_theta=_vision_theta(v))
    if kind == "qwen2_vl":
        embed = v["embed_dim"]
        return VisionConfig(embed_dim=embed, mlp_hidden=int(embed * v["mlp_ratio"]), hidden_act=v["hidden_act"],
                            out_dim=v["hidden_size"], **common)
    extra: dict[str, Any] = (
        dict(num_position_embeddings=v["num_position_embeddings"],
             deepstack_visual_indexes=tuple(v["deepstack_visual_indexes"]))
        if kind == "qwen3_vl" else
        dict(window_size=v["window_size"], fullatt_block_indexes=tuple(v["fullatt_block_indexes"]),
             tokens_per_second=v["tokens_per_second"]))
    return VisionConfig(embed_dim=v["hidden_size"], mlp_hidden=v["intermediate_size"], hidden_act=v["hidden_act"],
                        out_dim=v["out_hidden_size"], **extra, **common)


def _tie_word_embeddings(raw: dict[str, Any], kind: str) -> bool:
    """The model's tie: the top-level field (default false) is what PreTrainedModel.get_expanded_tied_weights_keys
    reads. Qwen2/2.5-VL's config __post_init__ also turns it on when a nested text_config ties; Qwen3-VL (+MoE)
    ignore the nested value (5.24's save_pretrained writes false above a MoE text_config's default true)."""
    top = _typed(raw, "tie_word_embeddings", False, bool, "")
    t, nested = _text_section(raw, kind)
    if kind == "qwen3_vl_moe" and nested:
        _typed(t, "tie_word_embeddings", True, bool, "text_config.")  # a declared (strict) field there
    if kind in QWEN3 or not nested:
        return top
    return top or bool(t.get("tie_word_embeddings"))


def _eos_token_id(raw: dict[str, Any], kind: str) -> int | tuple[int, ...] | None:
    """GenerationConfig.from_model_config's rule: a non-null top-level eos wins, else the text config's (its class
    default when unset). A nested null therefore never hides a top-level value."""
    t, _ = _text_section(raw, kind)
    eos = raw.get("eos_token_id")
    if eos is None:
        eos = t.get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else eos


def parse_config(raw: dict[str, Any]) -> ModelConfig:
    """Turn an HF config.json dict (flat legacy or nested text_config layout) into a ModelConfig.

    Each value is resolved as transformers 5.24 resolves it for that architecture (see the helpers above).
    """
    archs = raw.get("architectures") or []
    if omni.RELEASED_CUSTOM in archs:
        raise UnknownArchitectureError(
            f"{omni.RELEASED_CUSTOM} is the hub's custom-code form of Nemotron Omni (image tiling, vLLM's "
            "nano_nemotron_vl), which we do not serve; convert it to transformers' NemotronH_Omni_Reasoning_V3 "
            "(model_type nemotron_h_omni, one dynamic-resolution grid per image) and load that")
    if any(a in omni.ARCHITECTURES for a in archs) or (not archs and raw.get("model_type") == "nemotron_h_omni"):
        return _omni_model_config(raw)
    kind35 = next((q35.ARCHITECTURES[a] for a in archs if a in q35.ARCHITECTURES), None)
    if kind35 is not None or (not archs and raw.get("model_type") in q35.ARCHITECTURES.values()):
        return _qwen35_model_config(raw, kind35 or raw["model_type"])
    arch = next((a for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        by_type = {v: k for k, v in ARCHITECTURES.items()}
        if raw.get("model_type") not in by_type:
            raise UnknownArchitectureError(
                f"unknown architecture {archs or raw.get('model_type')!r}; supported: {sorted(ARCHITECTURES)}"
            )
        arch = by_type[raw["model_type"]]
    kind = ARCHITECTURES[arch]
    return ModelConfig(
        architecture=arch,
        kind=kind,
        text=_text_config(raw, kind),
        vision=_vision_config(kind, raw.get("vision_config")),
        tie_word_embeddings=_tie_word_embeddings(raw, kind),
        eos_token_id=_eos_token_id(raw, kind),
        **{key: _typed(raw, key, default, int, "") for key, default in TOKEN_IDS.items()},
    )


def _omni_model_config(raw: dict[str, Any]) -> ModelConfig:
    """Nemotron Omni: text.num_layers counts its attention layers (the KV cache holds only theirs). image_token_id
    is `<image>` (images and videos fill it), video_token_id the `<video>` marker the processor expands,
    vision_start/end the `<img>` / `</img>` ids around each run (from the tokenizer in load_config)."""
    raw, t, section = omni.omni_section(raw)
    lm, radio = section.lm, section.radio
    text = TextConfig(vocab_size=lm.vocab_size, hidden_size=lm.hidden, intermediate_size=lm.intermediate,
                      num_layers=sum(kind == "attention" for kind in lm.layers), num_heads=lm.heads,
                      num_kv_heads=lm.kv_heads, rms_norm_eps=lm.eps, rope_theta=0.0, mrope_section=(0, 0, 0),
                      attention_bias=False, head_dim_override=lm.head_dim)
    vision = VisionConfig(kind="radio", depth=radio.layers, embed_dim=radio.hidden, num_heads=radio.heads,
                          mlp_hidden=radio.mlp, hidden_act="gelu", out_dim=lm.hidden, patch_size=radio.patch,
                          temporal_patch_size=radio.temporal_patch or 2, in_channels=3, spatial_merge_size=2)
    eos = t.get("eos_token_id", raw.get("eos_token_id"))
    unset = lambda v: -1 if v is None else int(v)  # noqa: E731
    return ModelConfig("NemotronH_Omni_Reasoning_V3", "nemotron_h_omni", text, vision,
                       bool(t.get("tie_word_embeddings", False)), int(raw["image_token_id"]),
                       unset(raw.get("video_token_id")), unset(section.image_start_token_id),
                       unset(section.image_end_token_id), tuple(eos) if isinstance(eos, list) else eos, omni=section)


def _qwen35_model_config(raw: dict[str, Any], kind: str) -> ModelConfig:
    """Qwen3.5: text.num_layers counts the full-attention layers (the KV cache holds only theirs); the DeltaNet dims
    and layer pattern are on `.qwen35`; the tower is Qwen3-VL's without DeepStack."""
    t, section, theta, mrope = q35.qwen35_section(raw, kind)
    moe = (MoEConfig(t["num_experts"], t["num_experts_per_tok"], t["moe_intermediate_size"])
           if kind == "qwen3_5_moe" else None)
    text = TextConfig(vocab_size=t["vocab_size"], hidden_size=t["hidden_size"],
                      intermediate_size=t.get("intermediate_size", 0), num_layers=len(section.attention_layers),
                      num_heads=t["num_attention_heads"], num_kv_heads=t["num_key_value_heads"],
                      rms_norm_eps=t["rms_norm_eps"], rope_theta=theta, mrope_section=mrope,  # type: ignore[arg-type]
                      hidden_act=t["hidden_act"], attention_bias=bool(t["attention_bias"]), qk_norm=True,
                      mrope_interleaved=True, head_dim_override=t["head_dim"], moe=moe)
    vision = dict(raw.get("vision_config") or {}, deepstack_visual_indexes=[])
    eos = raw.get("eos_token_id", t.get("eos_token_id"))
    return ModelConfig(next(a for a, k in q35.ARCHITECTURES.items() if k == kind), kind, text,
                       _vision_config("qwen3_vl", vision), bool(raw.get("tie_word_embeddings", False)),
                       eos_token_id=tuple(eos) if isinstance(eos, list) else eos, qwen35=section,
                       **{key: int(raw.get(key, default)) for key, default in q35.TOKEN_IDS.items()})


def load_config(model_dir: str | Path) -> ModelConfig:
    """parse_config of model_dir/config.json; Nemotron Omni's `<img>` / `</img>` ids come from its tokenizer, as
    HF's processor takes them."""
    config = parse_config(json.loads((Path(model_dir) / "config.json").read_text()))
    if config.kind == "nemotron_h_omni" and config.vision_start_token_id < 0:
        from dataclasses import replace

        ids = _added_token_ids(Path(model_dir))
        config = replace(config, vision_start_token_id=ids.get("<img>", -1), vision_end_token_id=ids.get("</img>", -1))
    return config


def _added_token_ids(model_dir: Path) -> dict[str, int]:
    """The tokenizer's added (special) tokens -> ids, read from tokenizer.json without loading a tokenizer."""
    path = model_dir / "tokenizer.json"
    if not path.exists():
        return {}
    return {t["content"]: int(t["id"]) for t in json.loads(path.read_text()).get("added_tokens", [])}
