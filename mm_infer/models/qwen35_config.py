"""Qwen3.5 / Qwen3.5-MoE config.json (HF `qwen3_5`, `qwen3_5_moe`) -> the text section and the `qwen35` section of its
ModelConfig (the hybrid LM: gated DeltaNet and gated full-attention layers, partial interleaved M-RoPE), with
transformers 5.24's defaults and rules; the vision tower is Qwen3-VL's without DeepStack."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mm_infer.models.errors import UnsupportedConfigError

ARCHITECTURES = {"Qwen3_5ForConditionalGeneration": "qwen3_5", "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe"}
TEXT_DEFAULTS: dict[str, dict[str, Any]] = {  # configuration_qwen3_5[_moe].py class defaults
    "qwen3_5": dict(vocab_size=248320, hidden_size=4096, num_hidden_layers=32, num_attention_heads=16,
                    num_key_value_heads=4, head_dim=256, intermediate_size=12288),
    "qwen3_5_moe": dict(vocab_size=248320, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                        num_key_value_heads=2, head_dim=256, num_experts=256, num_experts_per_tok=8,
                        moe_intermediate_size=512, shared_expert_intermediate_size=512),
}
COMMON = dict(hidden_act="silu", rms_norm_eps=1e-6, attention_bias=False, linear_conv_kernel_dim=4,
              linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32)
TOKEN_IDS = dict(image_token_id=248056, video_token_id=248057, vision_start_token_id=248053,
                 vision_end_token_id=248054)
GDN_CHUNK = 64  # transformers' torch_chunk_gated_delta_rule chunk: a fixed argument, not a config field


@dataclass(frozen=True)
class Qwen35Config:
    layer_types: tuple[str, ...]  # "linear_attention" (gated DeltaNet) | "full_attention", one per layer
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int
    rotary_dim: int  # int(head_dim * partial_rotary_factor): only these leading dims of q and k rotate
    shared_expert_intermediate: int = 0  # MoE: the shared expert's width (0: dense)

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_types) if kind == "full_attention"]


def _layer_types(t: dict[str, Any]) -> tuple[str, ...]:
    types = t.get("layer_types")
    if types is None:
        interval = int(t.get("full_attention_interval", 4))
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(t["num_hidden_layers"])]
    if set(types) - {"linear_attention", "full_attention"}:
        raise UnsupportedConfigError(f"qwen3_5 layer_types must be linear_attention / full_attention, got {types}")
    return tuple(types)


def _rope(t: dict[str, Any], head_dim: int) -> tuple[float, tuple[int, int, int], int]:
    """(theta, mrope_section, rotary_dim); partial_rotary_factor inside rope_parameters wins over a top-level one."""
    rope = dict(t.get("rope_parameters") or t.get("rope_scaling") or {})
    factor = rope.get("partial_rotary_factor", t.get("partial_rotary_factor", 0.25))
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", "mrope"):
        raise UnsupportedConfigError(f"qwen3_5 rope_type {rope.get('rope_type')!r} is not supported (only default)")
    rotary = int(head_dim * factor)
    section = tuple(rope.get("mrope_section", (11, 11, 10)))
    if 2 * sum(section) != rotary:
        raise UnsupportedConfigError(f"mrope_section {section} does not cover the rotary dims {rotary}")
    return float(rope.get("rope_theta", t.get("rope_theta", 10000.0))), section, rotary  # type: ignore[return-value]


def qwen35_section(raw: dict[str, Any], kind: str) -> tuple[dict[str, Any], Qwen35Config, float, tuple[int, ...]]:
    """A `qwen3_5` / `qwen3_5_moe` config dict -> (its text section with transformers' defaults, the Qwen3.5 section,
    rope theta, mrope_section); config.py builds the ModelConfig around them."""
    t = {**TEXT_DEFAULTS[kind], **COMMON, **(raw.get("text_config") or {})}
    types = _layer_types(t)
    theta, section, rotary = _rope(t, t["head_dim"])
    q35 = Qwen35Config(types, t["linear_num_key_heads"], t["linear_num_value_heads"], t["linear_key_head_dim"],
                       t["linear_value_head_dim"], t["linear_conv_kernel_dim"], rotary,
                       t.get("shared_expert_intermediate_size", 0) if kind == "qwen3_5_moe" else 0)
    if q35.value_heads % q35.key_heads:
        raise UnsupportedConfigError(f"linear_num_value_heads {q35.value_heads} is not a multiple of "
                                     f"linear_num_key_heads {q35.key_heads}")
    return t, q35, theta, section
