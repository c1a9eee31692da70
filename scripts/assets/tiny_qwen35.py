"""Qwen3.5 / Qwen3.5-MoE presets for make_tiny_checkpoint.py: config.json, and weights written by HF's own model class
(per-expert tensors, as the hub stores them) plus MTP tensors that HF (and we) skip by name."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

_TEXT = dict(hidden=64, layers=4, heads=4, kv_heads=2, head_dim=32, nk=2, nv=4, dk=16, dv=16, conv=4,
             mrope=[2, 1, 1])
_VISION = dict(depth=2, hidden=32, heads=2, intermediate=64, num_pos=64)
PRESETS: dict[str, dict] = {
    "tiny-qwen3.5": dict(arch="Qwen3_5ForConditionalGeneration", model_type="qwen3_5", bpe_vocab=3000,
                         text=dict(_TEXT, intermediate=128), vision=_VISION, std=0.08),
    "tiny-qwen3.5-moe": dict(arch="Qwen3_5MoeForConditionalGeneration", model_type="qwen3_5_moe", bpe_vocab=3000,
                             text=dict(_TEXT, experts=8, top_k=2, moe_intermediate=32, shared_intermediate=48),
                             vision=_VISION, std=0.08),
}
MTP_TENSORS = {"mtp.fc.weight": (64, 128), "mtp.layers.0.input_layernorm.weight": (64,)}


def build_hf_config(spec: dict, vocab_size: int, ids: dict[str, int]) -> dict:
    """config.json in transformers' layout (nested text/vision configs; layer_types written out)."""
    t, v = spec["text"], spec["vision"]
    text = dict(
        vocab_size=vocab_size, hidden_size=t["hidden"], num_hidden_layers=t["layers"],
        layer_types=["linear_attention"] * (t["layers"] - 1) + ["full_attention"],
        num_attention_heads=t["heads"], num_key_value_heads=t["kv_heads"], head_dim=t["head_dim"],
        linear_num_key_heads=t["nk"], linear_num_value_heads=t["nv"], linear_key_head_dim=t["dk"],
        linear_value_head_dim=t["dv"], linear_conv_kernel_dim=t["conv"], rms_norm_eps=1e-6, hidden_act="silu",
        max_position_embeddings=32768, tie_word_embeddings=False, eos_token_id=ids["<|im_end|>"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": t["mrope"], "mrope_interleaved": True},
        model_type=spec["model_type"] + "_text",
    )
    if "experts" in t:
        text |= dict(num_experts=t["experts"], num_experts_per_tok=t["top_k"],
                     moe_intermediate_size=t["moe_intermediate"],
                     shared_expert_intermediate_size=t["shared_intermediate"])
    else:
        text["intermediate_size"] = t["intermediate"]
    vision = dict(model_type=spec["model_type"], depth=v["depth"], hidden_size=v["hidden"], num_heads=v["heads"],
                  intermediate_size=v["intermediate"], hidden_act="gelu_pytorch_tanh", in_channels=3, patch_size=16,
                  temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=t["hidden"],
                  num_position_embeddings=v["num_pos"])
    return dict(architectures=[spec["arch"]], model_type=spec["model_type"], tie_word_embeddings=False,
                image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                torch_dtype="float32", text_config=text, vision_config=vision)


def random_tensors(config: dict, spec: dict, seed: int) -> dict[str, torch.Tensor]:
    """HF's model built from `config`, every tensor drawn afresh (seeded, sorted by name), as save_pretrained writes
    them: zero-centred norm weights N(0, 0.1), A_log log U(1, 8), the rest N(0, std)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForImageTextToText

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(tmp)).float()
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, t in sorted(model.state_dict().items()):
                if not t.is_floating_point():
                    continue
                if name.endswith("A_log"):
                    t.copy_(torch.log(1 + 7 * torch.rand(t.shape, generator=gen)))
                elif "norm" in name and name.endswith(".weight"):
                    plain = "linear_attn.norm" in name or "visual" in name  # weights used as is
                    t.copy_((1.0 if plain else 0.0) + 0.1 * torch.randn(t.shape, generator=gen))
                else:
                    t.copy_(spec["std"] * torch.randn(t.shape, generator=gen))
            model.save_pretrained(tmp)
        tensors = load_file(str(Path(tmp) / "model.safetensors"))
    for name, shape in MTP_TENSORS.items():  # the hub's MTP head: skipped by name on load
        tensors[name] = torch.randn(shape, generator=gen)
    return tensors
