"""Qwen3-VL / Qwen3-VL-MoE presets for make_tiny_checkpoint.py: config.json, processor files, tensor shapes."""

from __future__ import annotations

import json
from pathlib import Path

_VISION = dict(depth=4, hidden=64, heads=4, intermediate=128, num_pos=64, deepstack=[0, 2])
PRESETS: dict[str, dict] = {
    "tiny-qwen3-vl": dict(
        arch="Qwen3VLForConditionalGeneration", model_type="qwen3_vl", layout="hub", tied=True,
        bpe_vocab=3000, vocab_size=None, save_dtype="float32", std=0.05, embed_std=0.1,
        text=dict(hidden=128, layers=3, heads=4, kv_heads=2, head_dim=32, intermediate=256, mrope=[6, 5, 5]),
        vision=_VISION, max_pixels=200704, video_max_pixels=802816,
    ),
    "tiny-qwen3-vl-moe": dict(
        arch="Qwen3VLMoeForConditionalGeneration", model_type="qwen3_vl_moe", layout="hub", tied=False,
        bpe_vocab=3000, vocab_size=None, save_dtype="float32", std=0.05, embed_std=0.1,
        text=dict(hidden=128, layers=3, heads=4, kv_heads=2, head_dim=48, intermediate=256, mrope=[8, 8, 8],
                  experts=8, top_k=2, moe_intermediate=32, mlp_only_layers=[1]),
        vision=_VISION, max_pixels=200704, video_max_pixels=802816,
    ),
}


def build_hf_config(spec: dict, vocab_size: int, ids: dict[str, int]) -> dict:
    """config.json in the hub's Qwen3-VL layout (nested text/vision configs, interleaved M-RoPE)."""
    t, v, moe = spec["text"], spec["vision"], "experts" in spec["text"]
    text = dict(
        vocab_size=vocab_size, hidden_size=t["hidden"], intermediate_size=t["intermediate"],
        num_hidden_layers=t["layers"], num_attention_heads=t["heads"], num_key_value_heads=t["kv_heads"],
        head_dim=t["head_dim"], hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
        attention_bias=False, attention_dropout=0.0, bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"], initializer_range=0.02, tie_word_embeddings=spec["tied"],
        model_type=spec["model_type"] + "_text",
        rope_scaling={"rope_type": "default", "mrope_section": t["mrope"], "mrope_interleaved": True},
        rope_theta=5000000.0,
    )
    if moe:
        text |= dict(num_experts=t["experts"], num_experts_per_tok=t["top_k"],
                     moe_intermediate_size=t["moe_intermediate"], decoder_sparse_step=1,
                     mlp_only_layers=t["mlp_only_layers"], norm_topk_prob=True)
    vision = dict(
        model_type=spec["model_type"], depth=v["depth"], hidden_size=v["hidden"], intermediate_size=v["intermediate"],
        num_heads=v["heads"], out_hidden_size=t["hidden"], hidden_act="gelu_pytorch_tanh", in_channels=3,
        patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=v["num_pos"],
        deepstack_visual_indexes=v["deepstack"], initializer_range=0.02,
    )
    return dict(
        architectures=[spec["arch"]], model_type=spec["model_type"], tie_word_embeddings=spec["tied"],
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        torch_dtype=spec["save_dtype"], text_config=text, vision_config=vision,
    )


def _merger(prefix: str, e: int, out: int, norm_dim: int) -> dict[str, tuple[int, ...]]:
    m = 4 * e
    return {prefix + "norm.weight": (norm_dim,), prefix + "norm.bias": (norm_dim,),
            prefix + "linear_fc1.weight": (m, m), prefix + "linear_fc1.bias": (m,),
            prefix + "linear_fc2.weight": (out, m), prefix + "linear_fc2.bias": (out,)}


def vision_shapes(spec: dict) -> dict[str, tuple[int, ...]]:
    v, h = spec["vision"], spec["text"]["hidden"]
    e, m = v["hidden"], v["intermediate"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.visual.patch_embed.proj.weight": (e, 3, 2, 16, 16), "model.visual.patch_embed.proj.bias": (e,),
        "model.visual.pos_embed.weight": (v["num_pos"], e),
    }
    for i in range(v["depth"]):
        p = f"model.visual.blocks.{i}."
        shapes |= {p + "attn.qkv.weight": (3 * e, e), p + "attn.qkv.bias": (3 * e,),
                   p + "attn.proj.weight": (e, e), p + "attn.proj.bias": (e,),
                   p + "mlp.linear_fc1.weight": (m, e), p + "mlp.linear_fc1.bias": (m,),
                   p + "mlp.linear_fc2.weight": (e, m), p + "mlp.linear_fc2.bias": (e,)}
        for norm in ("norm1", "norm2"):
            shapes |= {p + norm + ".weight": (e,), p + norm + ".bias": (e,)}
    shapes |= _merger("model.visual.merger.", e, h, e)
    for j in range(len(v["deepstack"])):
        shapes |= _merger(f"model.visual.deepstack_merger_list.{j}.", e, h, 4 * e)
    return shapes


def tensor_shapes(spec: dict, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """HF (hub) tensor names -> shapes; fused experts as stored on the hub: gate_up [E, H, 2I], down [E, I, H]."""
    t = spec["text"]
    h, hd = t["hidden"], t["head_dim"]
    q, kv = t["heads"] * hd, t["kv_heads"] * hd
    lm = "model.language_model."
    shapes = {lm + "embed_tokens.weight": (vocab_size, h), lm + "norm.weight": (h,)}
    for i in range(t["layers"]):
        p = f"{lm}layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                   p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                   p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)}
        if "experts" in t and i not in t["mlp_only_layers"]:
            n, mi = t["experts"], t["moe_intermediate"]
            shapes |= {p + "mlp.gate.weight": (n, h), p + "mlp.experts.gate_up_proj": (n, h, 2 * mi),
                       p + "mlp.experts.down_proj": (n, mi, h)}
        else:
            mi = t["intermediate"]
            shapes |= {p + "mlp.gate_proj.weight": (mi, h), p + "mlp.up_proj.weight": (mi, h),
                       p + "mlp.down_proj.weight": (h, mi)}
    if not spec["tied"]:
        shapes["lm_head.weight"] = (vocab_size, h)
    return shapes | vision_shapes(spec)


def write_processor_files(spec: dict, out_dir: Path) -> None:
    """Qwen3-VL processors: patch 16 (factor 32), mean = std = 0.5, Qwen3VLVideoProcessor for videos."""
    common = dict(do_resize=True, do_rescale=True, do_normalize=True, do_convert_rgb=True, resample=3,
                  rescale_factor=1 / 255, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], patch_size=16,
                  temporal_patch_size=2, merge_size=2, processor_class="Qwen3VLProcessor")
    image = dict(common, image_processor_type="Qwen2VLImageProcessor",
                 size={"shortest_edge": 4096, "longest_edge": spec["max_pixels"]})
    video = dict(common, video_processor_type="Qwen3VLVideoProcessor", fps=2, min_frames=4, max_frames=768,
                 do_sample_frames=True, cap_pixels_per_frame=False,
                 size={"shortest_edge": 4096, "longest_edge": spec["video_max_pixels"]})
    (out_dir / "preprocessor_config.json").write_text(json.dumps(image, indent=2) + "\n")
    (out_dir / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
    (out_dir / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen3VLProcessor"}, indent=2)
                                                    + "\n")
