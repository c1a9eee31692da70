"""Write deterministic, randomly initialised Qwen2-VL / Qwen2.5-VL / Qwen3-VL checkpoints in full HF format.

Usage:
  python scripts/assets/make_tiny_checkpoint.py                      # all tiny checkpoints under assets/models/
  python scripts/assets/make_tiny_checkpoint.py --preset tiny-qwen2-vl --out /tmp/x
  python scripts/assets/make_tiny_checkpoint.py --preset qwen2-vl-2b --out /tmp/qwen2-vl-2b-random

Presets:
  tiny-qwen2-vl    Qwen2VLForConditionalGeneration, untied head, legacy tensor names (model.*, visual.*)
  tiny-qwen2.5-vl  Qwen2_5_VLForConditionalGeneration, tied head, new names (model.language_model.*, ...),
                   window attention (fullatt_block_indexes=[1, 3], window_size=56)
  tiny-qwen3-vl    Qwen3VLForConditionalGeneration, tied head, DeepStack, learned position grid (tiny_qwen3.py)
  tiny-qwen3-vl-moe  Qwen3VLMoeForConditionalGeneration: 8 experts top-2 (fused hub layout), layer 1 dense
  tiny-nemotron-omni  NemotronH_Omni_Reasoning_V3: Mamba-2 / attention / MoE / MLP layers, RADIO vision
                   (tiny_nemotron_omni.py), released tensor names and config keys, MTP tensors to skip
  tiny-qwen3.5, tiny-qwen3.5-moe  Qwen3_5(Moe)ForConditionalGeneration: 3 gated-DeltaNet layers + 1 gated
                   full-attention layer; MoE 8 experts top-2 + shared expert; per-expert tensors, MTP to skip
  qwen2-vl-2b      real Qwen2-VL-2B dimensions (1536 hidden, 28 layers, 675M-param vision tower, vocab
                   151936 of which the tiny tokenizer uses 3008), random weights, bfloat16 on disk
                   (~4.4 GB, ~2 min and ~6 GB RAM on 2 cores); not committed, for speed/memory experiments.

The tokenizer is a byte-level BPE trained on Python's own stdlib sources plus the Qwen2-VL special tokens
and a Qwen2-VL style chat template. Weights are seeded, so rerunning reproduces the same files
(tokenizer.json exactly only under the same Python minor version, as its training text is the stdlib).
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: `scripts.*` imports as a package
from scripts.assets import tiny_nemotron_omni, tiny_qwen3, tiny_qwen35  # noqa: E402
from scripts.assets.tiny_chat_template import CHAT_TEMPLATE  # noqa: E402

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]
PRETOKENIZE_REGEX = (  # Qwen2's pre-tokenizer split
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_TINY_TEXT = dict(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, mrope=[4, 6, 6])
PRESETS: dict[str, dict] = {
    "tiny-qwen2-vl": dict(
        arch="Qwen2VLForConditionalGeneration", model_type="qwen2_vl", layout="legacy", tied=False,
        bpe_vocab=3000, vocab_size=None, save_dtype="float32", std=0.05, embed_std=0.1,
        text=_TINY_TEXT, vision=dict(depth=2, embed_dim=64, heads=4, mlp_ratio=4),
        max_pixels=200704, video_max_pixels=100352,
    ),
    "tiny-qwen2.5-vl": dict(
        arch="Qwen2_5_VLForConditionalGeneration", model_type="qwen2_5_vl", layout="new", tied=True,
        bpe_vocab=3000, vocab_size=None, save_dtype="float32", std=0.05, embed_std=0.1,
        text=_TINY_TEXT,
        vision=dict(depth=4, hidden=64, heads=4, intermediate=96, window_size=56, fullatt=[1, 3], tps=2),
        max_pixels=200704, video_max_pixels=100352,
    ),
    "qwen2-vl-2b": dict(
        arch="Qwen2VLForConditionalGeneration", model_type="qwen2_vl", layout="legacy", tied=True,
        bpe_vocab=3000, vocab_size=151936, save_dtype="bfloat16", std=0.02, embed_std=0.02,
        text=dict(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, mrope=[16, 24, 24]),
        vision=dict(depth=32, embed_dim=1280, heads=16, mlp_ratio=4),
        max_pixels=12845056, video_max_pixels=12845056,
    ),
} | tiny_qwen3.PRESETS | tiny_nemotron_omni.PRESETS | tiny_qwen35.PRESETS


def train_tokenizer(files: list[Path], vocab_size: int, specials: list[str] = SPECIAL_TOKENS) -> Tokenizer:
    """Byte-level BPE with Qwen2's pre-tokenizer, trained on `files`, then the special tokens appended."""
    tok = Tokenizer(models_bpe())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([f.read_text(encoding="utf-8", errors="replace") for f in files], trainer)
    tok.add_special_tokens(specials)
    return tok


def models_bpe():
    from tokenizers.models import BPE

    return BPE(unk_token=None, fuse_unk=False, byte_fallback=False)


def write_tokenizer_files(tok: Tokenizer, out_dir: Path, specials: list[str] = SPECIAL_TOKENS,
                          extra: dict[str, str] | None = None, template: str = CHAT_TEMPLATE) -> None:
    tok.save(str(out_dir / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): dict(content=t, lstrip=False, normalized=False, rstrip=False,
                                      single_word=False, special=True)
        for t in specials
    }
    cfg = dict(
        tokenizer_class="Qwen2Tokenizer", model_max_length=32768, bos_token=None, eos_token="<|im_end|>",
        pad_token="<|endoftext|>", unk_token=None, errors="replace", add_prefix_space=False,
        clean_up_tokenization_spaces=False, split_special_tokens=False, added_tokens_decoder=added,
        extra_special_tokens=extra if extra is not None else {
            "image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
            "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>"},
    )
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    specials = dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    (out_dir / "chat_template.jinja").write_text(template)


def write_processor_files(spec: dict, out_dir: Path) -> None:
    common = dict(
        do_resize=True, do_rescale=True, do_normalize=True, do_convert_rgb=True, resample=3,
        rescale_factor=1 / 255, image_mean=[0.48145466, 0.4578275, 0.40821073],
        image_std=[0.26862954, 0.26130258, 0.27577711], patch_size=14, temporal_patch_size=2, merge_size=2,
    )
    image = dict(common, image_processor_type="Qwen2VLImageProcessor", min_pixels=3136,
                 max_pixels=spec["max_pixels"], size={"shortest_edge": 3136, "longest_edge": spec["max_pixels"]})
    video = dict(common, video_processor_type="Qwen2VLVideoProcessor", min_pixels=3136,
                 max_pixels=spec["video_max_pixels"],
                 size={"shortest_edge": 3136, "longest_edge": spec["video_max_pixels"]})
    processor = "Qwen2_5_VLProcessor" if spec["model_type"] == "qwen2_5_vl" else "Qwen2VLProcessor"
    image["processor_class"] = video["processor_class"] = processor
    (out_dir / "preprocessor_config.json").write_text(json.dumps(image, indent=2) + "\n")
    (out_dir / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
    (out_dir / "processor_config.json").write_text(json.dumps({"processor_class": processor}, indent=2) + "\n")


def build_hf_config(spec: dict, vocab_size: int, ids: dict[str, int]) -> dict:
    """config.json: flat legacy text fields for Qwen2-VL, nested text_config for Qwen2.5-VL."""
    t, v = spec["text"], spec["vision"]
    text = dict(
        vocab_size=spec["vocab_size"] or vocab_size, hidden_size=t["hidden"], intermediate_size=t["intermediate"],
        num_hidden_layers=t["layers"], num_attention_heads=t["heads"], num_key_value_heads=t["kv_heads"],
        hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6, use_sliding_window=False,
        sliding_window=32768, max_window_layers=t["layers"], attention_dropout=0.0,
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], initializer_range=0.02,
    )
    top = dict(
        architectures=[spec["arch"]], model_type=spec["model_type"], tie_word_embeddings=spec["tied"],
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        vision_token_id=ids["<|vision_pad|>"], torch_dtype=spec["save_dtype"],
    )
    if spec["model_type"] == "qwen2_vl":
        vision = dict(depth=v["depth"], embed_dim=v["embed_dim"], hidden_size=t["hidden"], mlp_ratio=v["mlp_ratio"],
                      num_heads=v["heads"], in_channels=3, hidden_act="quick_gelu", patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2)
        rope = {"rope_scaling": {"type": "mrope", "mrope_section": t["mrope"]}, "rope_theta": 1000000.0}
        return dict(top, **text, **rope, vision_config=vision)
    vision = dict(depth=v["depth"], hidden_size=v["hidden"], intermediate_size=v["intermediate"],
                  num_heads=v["heads"], out_hidden_size=t["hidden"], hidden_act="silu", in_channels=3,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=v["window_size"],
                  fullatt_block_indexes=v["fullatt"], tokens_per_second=v["tps"])
    text["rope_parameters"] = {"rope_type": "default", "mrope_section": t["mrope"], "rope_theta": 1000000.0}
    return dict(top, text_config=dict(text, model_type="qwen2_5_vl_text"), vision_config=vision)


def tensor_shapes(spec: dict, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """HF legacy tensor names (model.*, visual.*, lm_head.*) -> shapes."""
    t, v = spec["text"], spec["vision"]
    h, hd = t["hidden"], t["hidden"] // t["heads"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab_size, h), "model.norm.weight": (h,)}
    for i in range(t["layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (h, h), p + "self_attn.q_proj.bias": (h,),
            p + "self_attn.k_proj.weight": (t["kv_heads"] * hd, h), p + "self_attn.k_proj.bias": (t["kv_heads"] * hd,),
            p + "self_attn.v_proj.weight": (t["kv_heads"] * hd, h), p + "self_attn.v_proj.bias": (t["kv_heads"] * hd,),
            p + "self_attn.o_proj.weight": (h, h), p + "mlp.gate_proj.weight": (t["intermediate"], h),
            p + "mlp.up_proj.weight": (t["intermediate"], h), p + "mlp.down_proj.weight": (h, t["intermediate"]),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        }
    if not spec["tied"]:
        shapes["lm_head.weight"] = (vocab_size, h)
    qwen25 = spec["model_type"] == "qwen2_5_vl"
    e = v["hidden"] if qwen25 else v["embed_dim"]
    shapes["visual.patch_embed.proj.weight"] = (e, 3, 2, 14, 14)
    for i in range(v["depth"]):
        p = f"visual.blocks.{i}."
        shapes |= {p + "attn.qkv.weight": (3 * e, e), p + "attn.qkv.bias": (3 * e,),
                   p + "attn.proj.weight": (e, e), p + "attn.proj.bias": (e,)}
        for norm in ("norm1", "norm2"):
            shapes[p + norm + ".weight"] = (e,)
            if not qwen25:
                shapes[p + norm + ".bias"] = (e,)
        if qwen25:
            m = v["intermediate"]
            for name, shape in (("gate_proj", (m, e)), ("up_proj", (m, e)), ("down_proj", (e, m))):
                shapes[p + f"mlp.{name}.weight"] = shape
                shapes[p + f"mlp.{name}.bias"] = (shape[0],)
        else:
            m = e * v["mlp_ratio"]
            shapes |= {p + "mlp.fc1.weight": (m, e), p + "mlp.fc1.bias": (m,),
                       p + "mlp.fc2.weight": (e, m), p + "mlp.fc2.bias": (e,)}
    merged = e * 4
    shapes |= {"visual.merger.ln_q.weight": (e,), "visual.merger.mlp.0.weight": (merged, merged),
               "visual.merger.mlp.0.bias": (merged,), "visual.merger.mlp.2.weight": (h, merged),
               "visual.merger.mlp.2.bias": (h,)}
    if not qwen25:
        shapes["visual.merger.ln_q.bias"] = (e,)
    return shapes


def new_layout_name(name: str) -> str:
    if name.startswith("visual."):
        return "model." + name
    if name.startswith("model."):
        return "model.language_model." + name[len("model."):]
    return name


def random_state_dict(spec: dict, tokenizer_vocab: int, seed: int) -> dict[str, torch.Tensor]:
    """Seeded normal init: matrices N(0, std), norm weights 1 + N(0, 0.1), biases N(0, 0.02)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    shapes_of = tiny_qwen3.tensor_shapes if spec["layout"] == "hub" else tensor_shapes
    for name, shape in shapes_of(spec, spec["vocab_size"] or tokenizer_vocab).items():
        is_norm = "norm" in name or "ln_q" in name
        if is_norm and name.endswith(".weight"):
            x = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        elif name.endswith(".bias"):
            x = 0.02 * torch.randn(shape, generator=gen)
        else:
            std = spec["embed_std"] if ("embed_tokens" in name or "lm_head" in name) else spec["std"]
            x = std * torch.randn(shape, generator=gen)
        key = new_layout_name(name) if spec["layout"] == "new" else name
        out[key] = x.to(getattr(torch, spec["save_dtype"]))
    return out


REPO = Path(__file__).resolve().parents[2]


def corpus_files() -> list[Path]:
    """A fixed, sorted list of stdlib text files used to train the BPE."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    names = [
        "LICENSE.txt", "this.py", "textwrap.py", "string.py", "difflib.py", "argparse.py", "functools.py",
        "json/__init__.py", "json/decoder.py", "email/message.py", "http/client.py", "pathlib.py",
        "typing.py", "dataclasses.py", "random.py", "statistics.py", "calendar.py", "csv.py",
    ]
    return [stdlib / n for n in names if (stdlib / n).exists()]


def write_nemotron_omni(spec: dict, out_dir: Path, seed: int) -> None:
    """The Nemotron Omni preset: its own specials and template, weights through HF's model class."""
    specials = tiny_nemotron_omni.SPECIAL_TOKENS + (tiny_nemotron_omni.AUDIO_TOKENS if "audio" in spec else [])
    tokenizer = train_tokenizer(corpus_files(), spec["bpe_vocab"], specials)
    ids = {tok: tokenizer.token_to_id(tok) for tok in specials}
    config = tiny_nemotron_omni.build_hf_config(spec, tokenizer.get_vocab_size(), ids)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    gen = {"bos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"],
           "eos_token_id": ids["<|im_end|>"]}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    extra = {"image_token": "<image>", "video_token": "<video>", "image_start_token": "<img>",
             "image_end_token": "</img>"} | ({"audio_token": "<so_embedding>"} if "audio" in spec else {})
    write_tokenizer_files(tokenizer, out_dir, specials, extra, tiny_nemotron_omni.CHAT_TEMPLATE)
    tiny_nemotron_omni.write_processor_files(spec, out_dir)
    tensors = {k: v.contiguous() for k, v in sorted(tiny_nemotron_omni.random_tensors(config, seed).items())}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    size_mb = (out_dir / "model.safetensors").stat().st_size / 2**20
    print(f"wrote {out_dir} ({len(tensors)} tensors, {tokenizer.get_vocab_size()} tokens, {size_mb:.2f} MiB)")


def write_qwen35(spec: dict, out_dir: Path, seed: int) -> None:
    """The Qwen3.5 presets: the Qwen specials and template, Qwen3-VL's processors, weights through HF's model class."""
    tokenizer = train_tokenizer(corpus_files(), spec["bpe_vocab"])
    ids = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    config = tiny_qwen35.build_hf_config(spec, tokenizer.get_vocab_size(), ids)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    gen = {"bos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"],
           "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    write_tokenizer_files(tokenizer, out_dir)
    tiny_qwen3.write_processor_files(dict(max_pixels=200704, video_max_pixels=802816), out_dir)
    tensors = {k: v.contiguous() for k, v in sorted(tiny_qwen35.random_tensors(config, spec, seed).items())}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    size_mb = (out_dir / "model.safetensors").stat().st_size / 2**20
    print(f"wrote {out_dir} ({len(tensors)} tensors, {tokenizer.get_vocab_size()} tokens, {size_mb:.2f} MiB)")


def write_checkpoint(preset: str, out_dir: Path, seed: int) -> None:
    spec = PRESETS[preset]
    out_dir.mkdir(parents=True, exist_ok=True)
    if spec["model_type"] == "nemotron_h_omni":
        write_nemotron_omni(spec, out_dir, seed)
        return
    if spec["model_type"] in ("qwen3_5", "qwen3_5_moe"):
        write_qwen35(spec, out_dir, seed)
        return
    tokenizer = train_tokenizer(corpus_files(), spec["bpe_vocab"])
    token_ids = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    vocab_size = tokenizer.get_vocab_size()
    qwen3 = spec["layout"] == "hub"
    config = (tiny_qwen3.build_hf_config if qwen3 else build_hf_config)(spec, vocab_size, token_ids)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    gen = {
        "bos_token_id": token_ids["<|endoftext|>"],
        "pad_token_id": token_ids["<|endoftext|>"],
        "eos_token_id": [token_ids["<|im_end|>"], token_ids["<|endoftext|>"]],
    }
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    write_tokenizer_files(tokenizer, out_dir)
    (tiny_qwen3.write_processor_files if qwen3 else write_processor_files)(spec, out_dir)
    tensors = random_state_dict(spec, vocab_size, seed)
    dtype = getattr(torch, spec["save_dtype"])
    tensors = {k: v.to(dtype).contiguous() for k, v in tensors.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    size_mb = (out_dir / "model.safetensors").stat().st_size / 2**20
    print(f"wrote {out_dir} ({len(tensors)} tensors, {len(SPECIAL_TOKENS)} specials + BPE = {vocab_size} tokens, "
          f"{size_mb:.2f} MiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), help="one preset; default: all tiny ones")
    parser.add_argument("--out", type=Path, help="output folder (default assets/models/<preset>)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    presets = [args.preset] if args.preset else ["tiny-qwen2-vl", "tiny-qwen2.5-vl", *tiny_qwen3.PRESETS,
                                                 *tiny_nemotron_omni.PRESETS, *tiny_qwen35.PRESETS]
    if args.out is not None and len(presets) != 1:
        parser.error("--out needs --preset")
    for preset in presets:
        write_checkpoint(preset, args.out or REPO / "assets" / "models" / preset, args.seed)


if __name__ == "__main__":
    main()
