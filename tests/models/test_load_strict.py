"""Loading never guesses: stray or missing tensors are named errors, ties follow transformers' tie_weights, and a
Qwen3-VL-MoE checkpoint written by transformers' own save_pretrained generates what HF generates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from model_cases import REPO, max_diff
from qwen3_cases import build_prompt, hf_inputs, our_logits
from safetensors.torch import load_file, save_file

from mm_infer import LLM, SamplingParams
from mm_infer.models import MissingTensorError, UnexpectedTensorError, load_model

ASSETS = {
    "qwen2_vl": REPO / "assets" / "models" / "tiny-qwen2-vl",
    "qwen2_5_vl": REPO / "assets" / "models" / "tiny-qwen2.5-vl",
    "qwen3_vl": REPO / "assets" / "models" / "tiny-qwen3-vl",
    "qwen3_vl_moe": REPO / "assets" / "models" / "tiny-qwen3-vl-moe",
}
LM_EMBED = "model.language_model.embed_tokens.weight"


def _edited(kind: str, dst: Path, edit) -> Path:
    """A copy of the tiny checkpoint whose tensors dict went through edit(tensors), saved in the new name layout."""
    shutil.copytree(ASSETS[kind], dst)
    tensors = load_file(str(ASSETS[kind] / "model.safetensors"))
    tensors = {("model.language_model." + n[len("model."):] if n.startswith("model.") and not n.startswith(
        ("model.visual.", "model.language_model.")) else "model." + n if n.startswith("visual.") else n): t
        for n, t in tensors.items()}
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def _hf(path: Path):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("extra", ["model.language_model.layers.0.mlp.extra.weight", "model.visual.merger.bias9",
                                   "model.visual.rotary_pos_emb.inv_freq", "mtp.layers.0.norm.weight"])
@pytest.mark.parametrize("kind", sorted(ASSETS))
def test_extra_tensor_is_named(kind, extra, tmp_path):
    ck = _edited(kind, tmp_path / "ck", lambda t: t.update({extra: torch.ones(4)}))
    with pytest.raises(UnexpectedTensorError, match=extra.replace(".", r"\.")):
        load_model(ck)


@pytest.mark.parametrize("kind", sorted(ASSETS))
def test_a_name_transformers_ignores_is_ignored(kind, tmp_path):
    """PreTrainedModel._adjust_missing_and_unexpected_keys drops rotary_emb.inv_freq: a stale buffer, not a weight."""
    ck = _edited(kind, tmp_path / "ck", lambda t: t.update({"model.language_model.rotary_emb.inv_freq": torch.ones(8)}))
    load_model(ck)


@pytest.mark.parametrize("missing", ["model.language_model.layers.1.self_attn.k_proj.weight",
                                     "model.visual.blocks.0.norm1.weight", LM_EMBED])
@pytest.mark.parametrize("kind", sorted(ASSETS))
def test_missing_tensor_is_named(kind, missing, tmp_path):
    ck = _edited(kind, tmp_path / "ck", lambda t: t.pop(missing))
    our_name = missing.replace("model.language_model.", "language.").replace("model.visual.", "visual.")
    with pytest.raises(MissingTensorError, match=our_name.replace(".", r"\.")):
        load_model(ck)


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen3_vl_moe"])
def test_untied_checkpoint_without_lm_head_is_named(kind, tmp_path):
    ck = _edited(kind, tmp_path / "ck", lambda t: t.pop("lm_head.weight"))
    with pytest.raises(MissingTensorError, match=r"lm_head\.weight"):
        load_model(ck)


def _tied_with(tmp_path: Path, lm_head) -> Path:
    """tiny-qwen3-vl (tied, stores no lm_head) with lm_head(embeddings) stored as lm_head.weight."""
    return _edited("qwen3_vl", tmp_path / "ck", lambda t: t.update({"lm_head.weight": lm_head(t[LM_EMBED])}))


@torch.inference_mode()
def _assert_logits_equal_hf(ck: Path) -> None:
    model, cfg = load_model(ck)
    prompt = build_prompt(cfg, [5, ("image", 1, 4, 4), 3], seed=3)
    want = _hf(ck)(**hf_inputs(cfg, prompt)).logits[0]
    assert max_diff(our_logits(model, cfg, prompt), want) < 1e-4


def test_tied_config_with_a_different_lm_head_unties_as_transformers_does(tmp_path):
    ck = _tied_with(tmp_path, lambda e: torch.randn(e.shape, generator=torch.Generator().manual_seed(0)))
    model, cfg = load_model(ck)
    assert model.lm_head is not None and not cfg.tie_word_embeddings
    _assert_logits_equal_hf(ck)


def test_tied_config_with_an_equal_lm_head_stays_tied(tmp_path):
    model, cfg = load_model(_tied_with(tmp_path, lambda e: e.clone()))
    assert model.lm_head is None and cfg.tie_word_embeddings


def test_tied_config_storing_only_lm_head_fills_the_embeddings(tmp_path):
    """tie_weights swaps source and target when only the target is stored."""
    ck = _edited("qwen3_vl", tmp_path / "ck", lambda t: t.update({"lm_head.weight": t.pop(LM_EMBED)}))
    model, _ = load_model(ck)
    assert model.lm_head is None
    _assert_logits_equal_hf(ck)


@pytest.fixture(scope="module")
def saved_moe(tmp_path_factory) -> Path:
    """Qwen3-VL-MoE written by transformers' save_pretrained from tiny-qwen3-vl-moe's config, text_config's tie left
    at its class default: 5.24 then writes top-level false, nested true, and ships an lm_head unlike the embeddings."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    src, out = ASSETS["qwen3_vl_moe"], tmp_path_factory.mktemp("saved") / "moe"
    raw = json.loads((src / "config.json").read_text())
    raw["text_config"].pop("tie_word_embeddings")
    build = tmp_path_factory.mktemp("cfg")
    (build / "config.json").write_text(json.dumps(raw))
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(build), dtype=torch.float32)
    model.save_pretrained(out)
    for f in src.iterdir():
        if not (out / f.name).exists() and f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    return out


def test_save_pretrained_writes_the_disagreeing_ties(saved_moe):
    raw = json.loads((saved_moe / "config.json").read_text())
    assert raw["tie_word_embeddings"] is False and raw["text_config"]["tie_word_embeddings"] is True
    tensors = load_file(str(saved_moe / "model.safetensors"))
    assert not torch.equal(tensors["lm_head.weight"], tensors[LM_EMBED])


@torch.inference_mode()
def test_save_pretrained_moe_greedy_equals_hf_generate(saved_moe):
    llm = LLM(str(saved_moe), num_kv_blocks=128, max_num_batched_tokens=1024, cpu_threads=1)
    cfg = llm.engine.preparer.model_config
    prompts = [{"prompt_token_ids": list(range(40, 60))},
               {"prompt_token_ids": [7, 300, 11, 2900, 5, 1234, 88, 17, 2047, 9]}]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    hf = _hf(saved_moe)
    for prompt, out in zip(prompts, outs, strict=True):
        ids = torch.tensor([prompt["prompt_token_ids"]])
        ref = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                          suppress_tokens=[cfg.image_token_id, cfg.video_token_id])[0, ids.shape[1]:].tolist()
        assert out.outputs[0].token_ids == ref and len(ref) == 8, (out.outputs[0].token_ids, ref)
