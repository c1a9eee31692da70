"""The tiny Qwen3-VL checkpoints: HF loads them whole, their configs hold what the tests rely on, they reproduce."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from model_cases import REPO
from qwen3_cases import QWEN3

from mm_infer.models import load_config


@pytest.mark.parametrize("kind", sorted(QWEN3))
def test_transformers_loads_every_tensor(kind):
    from transformers import AutoModelForImageTextToText

    model, info = AutoModelForImageTextToText.from_pretrained(QWEN3[kind], dtype=torch.float32,
                                                              output_loading_info=True)
    assert type(model).__name__ == load_config(QWEN3[kind]).architecture
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys


@pytest.mark.parametrize("kind", sorted(QWEN3))
def test_configs_and_size(kind):
    cfg = load_config(QWEN3[kind])
    assert cfg.kind == kind and cfg.vision.kind == "qwen3_vl"
    vision = cfg.vision
    assert (vision.patch_size, vision.spatial_merge_size, vision.deepstack_visual_indexes) == (16, 2, (0, 2))
    assert cfg.vision.num_position_embeddings == 64 and cfg.text.mrope_interleaved and cfg.text.qk_norm
    if kind == "qwen3_vl_moe":
        assert (cfg.text.moe.num_experts, cfg.text.moe.top_k) == (8, 2)
        assert cfg.text.head_dim * cfg.text.num_heads != cfg.text.hidden_size  # explicit head_dim is honoured
    raw = json.loads((QWEN3[kind] / "video_preprocessor_config.json").read_text())
    assert raw["video_processor_type"] == "Qwen3VLVideoProcessor" and raw["patch_size"] == 16
    assert sum(f.stat().st_size for f in QWEN3[kind].iterdir()) < 8 * 2**20


def test_tokenizer_and_template_are_the_tiny_ones():
    for name in ("tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        want = (REPO / "assets" / "models" / "tiny-qwen2-vl" / name).read_bytes()
        assert all((path / name).read_bytes() == want for path in QWEN3.values()), name


@pytest.mark.parametrize("kind", sorted(QWEN3))
def test_generator_reproduces_the_committed_files(tmp_path, kind):
    preset = QWEN3[kind].name
    subprocess.run([sys.executable, str(REPO / "scripts" / "assets" / "make_tiny_checkpoint.py"), "--preset", preset,
                    "--out", str(tmp_path)], check=True, capture_output=True)
    for name in ("model.safetensors", "config.json", "preprocessor_config.json", "video_preprocessor_config.json"):
        assert (tmp_path / name).read_bytes() == (QWEN3[kind] / name).read_bytes(), name
