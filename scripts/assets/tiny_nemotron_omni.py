"""Nemotron 3 Nano Omni preset for make_tiny_checkpoint.py: config.json (released names), processor files, weights
written by HF's own model class in the released tensor layout, plus MTP tensors that HF (and we) skip by name."""

from __future__ import annotations

import json
from pathlib import Path

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<img>", "</img>", "<video>",
                  "<think>", "</think>"]
AUDIO_TOKENS = ["<so_start>", "<so_embedding>", "<so_end>"]  # the audio preset's specials, after the others
AUDIO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48, num_mel_bins=80,
             subsampling_conv_channels=8, conv_kernel_size=9, subsampling_factor=8, projection_hidden_size=40,
             projection_bias=True)  # the released layout: no model_type (HF's quirk)
PRESETS: dict[str, dict] = {
    "tiny-nemotron-omni": dict(
        arch="NemotronH_Omni_Reasoning_V3", model_type="nemotron_h_omni", bpe_vocab=3000,
        pattern="M*EME-M*E",  # mamba, attention, moe, mamba, moe, mlp, mamba, attention, moe
        text=dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, mamba_heads=8, mamba_head_dim=16,
                  state=16, groups=2, conv_kernel=4, chunk=8, experts=8, top_k=2, moe_intermediate=32,
                  shared_intermediate=48, n_group=2, topk_group=1, scaling=2.5),
        vision=dict(hidden=32, layers=2, heads=4, max_img_size=256, cls=3, registers=7),
        projector_hidden=48, std=0.08,
    ),
}
PRESETS["tiny-nemotron-omni-audio"] = dict(PRESETS["tiny-nemotron-omni"], audio=AUDIO)
CHAT_TEMPLATE = (  # ChatML, with the processor's `<image>` / `<video>` markers where media goes
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\n<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or content['type'] == 'image_url' or 'image' in content"
    " or 'image_url' in content %}<image>\n"
    "{% elif content['type'] == 'video' or content['type'] == 'video_url' or 'video' in content"
    " or 'video_url' in content %}<video>\n"
    "{% elif content['type'] in ('audio', 'input_audio', 'audio_url') %}<so_embedding>\n"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MTP_TENSORS = {"language_model.mtp.layers.0.norm.weight": (64,), "language_model.mtp.layers.0.enorm.weight": (64,)}


def build_hf_config(spec: dict, vocab_size: int, ids: dict[str, int]) -> dict:
    """config.json as the hub releases it: legacy `llm_config`, `img_context_token_id`, `hybrid_override_pattern`."""
    t, v = spec["text"], spec["vision"]
    llm = dict(
        model_type="nemotron_h", vocab_size=vocab_size, hidden_size=t["hidden"],
        hybrid_override_pattern=spec["pattern"], num_attention_heads=t["heads"], num_key_value_heads=t["kv_heads"],
        head_dim=t["head_dim"], intermediate_size=t["intermediate"], mlp_hidden_act="relu2",
        mamba_num_heads=t["mamba_heads"], mamba_head_dim=t["mamba_head_dim"], ssm_state_size=t["state"],
        n_groups=t["groups"], conv_kernel=t["conv_kernel"], chunk_size=t["chunk"], n_routed_experts=t["experts"],
        num_experts_per_tok=t["top_k"], moe_intermediate_size=t["moe_intermediate"],
        moe_shared_expert_intermediate_size=t["shared_intermediate"], n_group=t["n_group"],
        topk_group=t["topk_group"], norm_topk_prob=True, routed_scaling_factor=t["scaling"],
        layer_norm_epsilon=1e-5, num_nextn_predict_layers=1, tie_word_embeddings=False,
        pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
    )
    vision = dict(model_type="radio", hidden_size=v["hidden"], num_hidden_layers=v["layers"],
                  num_attention_heads=v["heads"], mlp_ratio=4.0, patch_size=16, max_img_size=v["max_img_size"],
                  num_cls_tokens=v["cls"], num_registers=v["registers"], video_temporal_patch_size=2, qkv_bias=True,
                  hidden_act="gelu", layer_norm_eps=1e-6)
    config = dict(architectures=[spec["arch"]], model_type=spec["model_type"], downsample_ratio=0.5,
                  projector_hidden_size=spec["projector_hidden"], vision_hidden_size=v["hidden"],
                  video_temporal_patch_size=2, video_pruning_rate=0.0, img_context_token_id=ids["<image>"],
                  video_context_token_id=ids["<video>"], torch_dtype="float32", llm_config=llm, vision_config=vision)
    if "audio" in spec:
        config |= dict(sound_config=spec["audio"], sound_context_token_id=ids["<so_embedding>"])
    return config


def write_processor_files(spec: dict, out_dir: Path) -> None:
    """HF's Nemotron Omni processors with small patch budgets (CLIP mean/std, patch 16, merge 2)."""
    mean, std = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
    image = dict(image_processor_type="NemotronH_Omni_Reasoning_V3ImageProcessor", patch_size=16,
                 downsample_ratio=0.5, min_num_patches=16, max_num_patches=256, max_model_len=4096,
                 image_mean=mean, image_std=std, do_rescale=True, do_normalize=True,  # no do_resize: HF wants size
                 do_convert_rgb=True, resample=3, rescale_factor=1 / 255)
    video = dict(video_processor_type="NemotronH_Omni_Reasoning_V3VideoProcessor", patch_size=16,
                 downsample_ratio=0.5, video_target_num_patches=64, video_maintain_aspect_ratio=True,
                 temporal_patch_size=2, norm_mean=mean, norm_std=std, do_sample_frames=False)
    processor: dict = {"processor_class": "NemotronH_Omni_Reasoning_V3Processor"}
    if "audio" in spec:  # HF's ParakeetFeatureExtractor at its defaults, mel bins as the tower takes them
        processor |= dict(audio_sampling_rate=16000, audio_subsampling_factor=8, audio_hop_length=160,
                          feature_extractor=dict(feature_extractor_type="ParakeetFeatureExtractor",
                                                 feature_size=spec["audio"]["num_mel_bins"], sampling_rate=16000,
                                                 hop_length=160))
    (out_dir / "preprocessor_config.json").write_text(json.dumps(image, indent=2) + "\n")
    (out_dir / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
    (out_dir / "processor_config.json").write_text(json.dumps(processor, indent=2) + "\n")


def random_tensors(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """HF's model built from `config`, every tensor drawn afresh (seeded, sorted by name), in the released names.

    Norm and LayerScale weights are 1 + N(0, 0.1), the router bias N(0, 0.5) (so it changes the selection), A_log
    log U(1, 8), dt_bias and the rest N(0, std); `save_pretrained`'s reverse mapping gives the hub's layout."""
    import tempfile

    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForImageTextToText

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(tmp)).float()
        gen = torch.Generator().manual_seed(seed)
        std = PRESETS["tiny-nemotron-omni"]["std"]
        with torch.no_grad():
            for name, t in sorted(model.state_dict().items()):
                if not t.is_floating_point():
                    continue
                if name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "lambda1", "norm_f.weight",
                                  "layer_norm.weight")):
                    t.copy_(1.0 + 0.1 * torch.randn(t.shape, generator=gen))
                elif name.endswith("e_score_correction_bias"):
                    t.copy_(0.5 * torch.randn(t.shape, generator=gen))
                elif name.endswith("A_log"):
                    t.copy_(torch.log(1 + 7 * torch.rand(t.shape, generator=gen)))
                elif name.endswith("running_var"):  # batch-norm statistics of the audio tower's conv modules
                    t.copy_(0.5 + 1.5 * torch.rand(t.shape, generator=gen))
                elif name.endswith("running_mean"):
                    t.copy_(0.5 * torch.randn(t.shape, generator=gen))
                else:
                    t.copy_(std * torch.randn(t.shape, generator=gen))
            model.save_pretrained(tmp)
        tensors = load_file(str(Path(tmp) / "model.safetensors"))
    for name, shape in MTP_TENSORS.items():  # a released checkpoint's MTP head: skipped by name on load
        tensors[name] = torch.randn(shape, generator=gen)
    return tensors
