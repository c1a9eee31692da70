"""A thinking copy of a tiny checkpoint: Qwen3's <think> and </think> added as two vocabulary tokens, and a template."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

# a chat template that opens a think block, as Qwen3's does; enable_thinking=False closes it empty
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}")


def thinking_checkpoint(src: Path, dst: Path) -> Path:
    """src copied to dst with <think> and </think> as the next two token ids (not special: the text keeps them, as
    Qwen3's tokenizer does); their embedding and lm_head rows are zero. Returns dst."""
    shutil.copytree(src, dst)
    weights = load_file(dst / "model.safetensors")
    config = json.loads((dst / "config.json").read_text())
    grown = [n for n in weights if n.endswith(("embed_tokens.weight", "lm_head.weight")) and "visual" not in n]
    think = next(weights[n].shape[0] for n in grown if n.endswith("embed_tokens.weight"))
    for name in grown:  # Qwen2-VL's model.embed_tokens, Qwen2.5-VL's model.language_model.embed_tokens; lm_head
        weights[name] = torch.cat([weights[name], weights[name].new_zeros(2, weights[name].shape[1])])
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    config["vocab_size"] = think + 2
    if isinstance(config.get("text_config"), dict) and "vocab_size" in config["text_config"]:
        config["text_config"]["vocab_size"] = think + 2
    (dst / "config.json").write_text(json.dumps(config))
    tok = json.loads((dst / "tokenizer.json").read_text())
    tok_config = json.loads((dst / "tokenizer_config.json").read_text())
    for tid, tag in ((think, "<think>"), (think + 1, "</think>")):
        entry = {"content": tag, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                 "special": False}
        tok["added_tokens"].append({"id": tid, **entry})
        tok_config["added_tokens_decoder"][str(tid)] = entry
    (dst / "tokenizer.json").write_text(json.dumps(tok))
    (dst / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return dst
