"""The committed tiny checkpoints: tokenizer, chat template, config ids, size, and reproducibility."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from model_cases import CHECKPOINTS, REPO

from mm_infer.models import load_config

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
            "<|image_pad|>", "<|video_pad|>"]


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def tok_and_cfg(request):
    from transformers import AutoTokenizer

    path = CHECKPOINTS[request.param]
    return AutoTokenizer.from_pretrained(path), load_config(path), path


def test_config_token_ids_match_the_tokenizer(tok_and_cfg):
    tok, cfg, path = tok_and_cfg
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    assert len(set(ids.values())) == len(SPECIALS) and all(i >= 0 for i in ids.values())
    assert cfg.image_token_id == ids["<|image_pad|>"]
    assert cfg.video_token_id == ids["<|video_pad|>"]
    assert cfg.vision_start_token_id == ids["<|vision_start|>"]
    assert cfg.vision_end_token_id == ids["<|vision_end|>"]
    assert tok.eos_token == "<|im_end|>" and cfg.eos_token_id == ids["<|im_end|>"]
    gen = json.loads((path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [ids["<|im_end|>"], ids["<|endoftext|>"]]
    assert len(tok) == cfg.text.vocab_size
    for t in SPECIALS:  # specials are atomic, never split by BPE
        assert tok.encode(t, add_special_tokens=False) == [ids[t]]


@pytest.mark.parametrize("image_part", [{"type": "image"}, {"type": "image_url", "image_url": {"url": "x"}}])
@pytest.mark.parametrize("video_part", [{"type": "video"}, {"type": "video_url", "video_url": {"url": "y"}}])
def test_chat_template_emits_vision_placeholders(tok_and_cfg, image_part, video_part):
    tok, _, _ = tok_and_cfg
    messages = [{"role": "user", "content": [image_part, {"type": "text", "text": "What is here?"}, video_part]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "<|vision_start|><|image_pad|><|vision_end|>What is here?<|vision_start|><|video_pad|><|vision_end|>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_text_round_trips(tok_and_cfg):
    tok, _, _ = tok_and_cfg
    text = "def f(x):\n    return x * 2  # naïve café ✓"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) < len(text.encode()) and tok.decode(ids) == text


def test_image_processor_config_loads_offline():
    from transformers import AutoImageProcessor

    proc = AutoImageProcessor.from_pretrained(CHECKPOINTS["qwen2_vl"])
    assert (proc.patch_size, proc.temporal_patch_size, proc.merge_size) == (14, 2, 2)
    assert proc.size["longest_edge"] == 200704


def test_checkpoints_are_small():
    for path in CHECKPOINTS.values():
        assert sum(f.stat().st_size for f in path.iterdir()) < 8 * 2**20


def test_generator_reproduces_the_committed_files(tmp_path):
    """Weights and configs are seeded; the BPE merges also depend on the stdlib text it trains on,
    so tokenizer.json is compared only under the Python minor version that wrote it (3.11)."""
    out = tmp_path / "tiny"
    subprocess.run([sys.executable, str(REPO / "scripts/assets/make_tiny_checkpoint.py"), "--preset", "tiny-qwen2-vl",
                    "--out", str(out)], check=True, capture_output=True)
    names = ["model.safetensors", "config.json", "tokenizer_config.json", "generation_config.json"]
    if sys.version_info[:2] == (3, 11):
        names.append("tokenizer.json")
    for name in names:
        assert (out / name).read_bytes() == (CHECKPOINTS["qwen2_vl"] / name).read_bytes(), name
