"""parse_config resolves top-level vs nested config values exactly as transformers does, per architecture."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from model_cases import REPO

from mm_infer.models import ModelLoadError
from mm_infer.models.config import parse_config

ASSETS = {
    "qwen2_vl": REPO / "assets" / "models" / "tiny-qwen2-vl",  # flat legacy layout: text fields at the top
    "qwen2_5_vl": REPO / "assets" / "models" / "tiny-qwen2.5-vl",
    "qwen3_vl": REPO / "assets" / "models" / "tiny-qwen3-vl",
    "qwen3_vl_moe": REPO / "assets" / "models" / "tiny-qwen3-vl-moe",
}
Edit = Callable[[dict, dict], object]  # (raw config, its text section: text_config, or raw when flat)


def _rope(t: dict) -> dict:
    return t.get("rope_scaling") or t.get("rope_parameters")


def _set_tie(top: bool | None, nested: bool | None) -> Edit:
    def edit(raw: dict, t: dict) -> None:
        raw.pop("tie_word_embeddings", None)
        if t is not raw:
            t.pop("tie_word_embeddings", None)
            if nested is not None:
                t["tie_word_embeddings"] = nested
        if top is not None:
            raw["tie_word_embeddings"] = top
    return edit


def _no_theta(raw: dict, t: dict) -> None:
    raw["rope_theta"] = 123.0  # top-level theta beside a nested text_config: transformers ignores it
    t.pop("rope_theta", None)
    _rope(t).pop("rope_theta", None)


def _both_rope_dicts(raw: dict, t: dict) -> None:
    t["rope_scaling"] = {**_rope(t), "rope_theta": 777.0}  # rope_scaling wins over rope_parameters
    t["rope_parameters"] = {**_rope(t), "rope_theta": 555.0}


def _rope_at_top(raw: dict, t: dict) -> None:
    raw["rope_scaling"] = dict(_rope(t))
    t.pop("rope_scaling", None)
    t.pop("rope_parameters", None)


VARIANTS: dict[str, Edit] = {
    "as_shipped": lambda raw, t: None,
    **{f"tie_top_{a}_nested_{b}": _set_tie(a, b)
       for a, b in [(False, True), (True, False), (None, True), (True, None), (None, False), (None, None)]},
    "eos_top_7_nested_null": lambda raw, t: (raw.update(eos_token_id=7), t.update(eos_token_id=None)),
    "eos_top_7_nested_9": lambda raw, t: (raw.update(eos_token_id=7), t.update(eos_token_id=9)),
    "eos_top_null_nested_9": lambda raw, t: (raw.update(eos_token_id=None), t.update(eos_token_id=9)),
    "eos_top_list_nested_absent": lambda raw, t: (t.pop("eos_token_id", None), raw.update(eos_token_id=[7, 8])),
    "eos_absent": lambda raw, t: (raw.pop("eos_token_id", None), t.pop("eos_token_id", None)),
    "eos_null": lambda raw, t: (raw.pop("eos_token_id", None), t.update(eos_token_id=None)),
    "token_ids_nested": lambda raw, t: t.update(image_token_id=5, video_token_id=6, vision_start_token_id=1),
    "token_ids_absent": lambda raw, t: [raw.pop(k, None) for k in ("image_token_id", "video_token_id",
                                                                    "vision_start_token_id", "vision_end_token_id")],
    "theta_only_at_top": _no_theta,
    "rope_scaling_and_rope_parameters": _both_rope_dicts,
    "rope_theta_key_and_dict": lambda raw, t: (t.update(rope_theta=999.0), _rope(t).update(rope_theta=333.0)),
    "rope_type_type_key": lambda raw, t: _rope(t).update(type="default"),
    "rope_dict_at_top": _rope_at_top,
    "vision_rope_theta_key": lambda raw, t: raw["vision_config"].update(rope_theta=20000.0),
    "vision_rope_parameters": lambda raw, t: raw["vision_config"].update(rope_parameters={"rope_theta": 30000.0}),
    "vision_rope_scaling_wins": lambda raw, t: raw["vision_config"].update(
        rope_scaling={"rope_theta": 40000.0}, rope_parameters={"rope_theta": 30000.0}),
    "text_defaults": lambda raw, t: [t.pop(k, None) for k in ("num_key_value_heads", "rms_norm_eps", "head_dim",
                                                             "hidden_act", "attention_bias")],
    "no_text_config": lambda raw, t: raw.pop("text_config", None),
}
# transformers refuses these (strict field types, a None base, an unknown rope type): so must we
REFUSED: dict[str, Edit] = {
    "tie_top_null": lambda raw, t: raw.update(tie_word_embeddings=None),
    "image_token_id_null": lambda raw, t: raw.update(image_token_id=None),
    "vision_end_token_id_null": lambda raw, t: raw.update(vision_end_token_id=None),
    "rope_theta_null": lambda raw, t: (_rope(t).pop("rope_theta", None), t.update(rope_theta=None)),
}


def _variant(kind: str, edit: Edit) -> dict:
    raw = copy.deepcopy(json.loads((ASSETS[kind] / "config.json").read_text()))
    edit(raw, raw.get("text_config", raw))
    return raw


def _hf(raw: dict, tmp: Path) -> dict:
    """What transformers resolves: its config class, the model it builds (ties, rotary), its generation config."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    (tmp / "config.json").write_text(json.dumps(raw))
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(tmp))
    lm, cfg = model.model.language_model, model.config
    return dict(
        tie=model.lm_head.weight is lm.embed_tokens.weight,
        eos=model.generation_config.eos_token_id,
        ids=(cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id),
        theta=float(lm.config.rope_parameters["rope_theta"]),
        section=tuple(lm.rotary_emb.mrope_section),
        vision_theta=float(cfg.vision_config.rope_parameters["rope_theta"]),
        text=(lm.config.hidden_size, lm.config.num_attention_heads, lm.config.num_key_value_heads,
              lm.config.rms_norm_eps, lm.layers[0].self_attn.head_dim, lm.config.hidden_act),
    )


def _ours(raw: dict) -> dict:
    c = parse_config(raw)
    return dict(
        tie=c.tie_word_embeddings,
        eos=list(c.eos_token_id) if isinstance(c.eos_token_id, tuple) else c.eos_token_id,
        ids=(c.image_token_id, c.video_token_id, c.vision_start_token_id, c.vision_end_token_id),
        theta=c.text.rope_theta,
        section=c.text.mrope_section,
        vision_theta=c.vision.rope_theta,
        text=(c.text.hidden_size, c.text.num_heads, c.text.num_kv_heads, c.text.rms_norm_eps, c.text.head_dim,
              c.text.hidden_act),
    )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("kind", sorted(ASSETS))
def test_resolution_equals_transformers(kind, variant, tmp_path):
    raw = _variant(kind, VARIANTS[variant])
    want = _hf(raw, tmp_path)
    if 2 * sum(want["section"]) != want["text"][4]:  # transformers builds it, but its M-RoPE would misrotate
        with pytest.raises(ModelLoadError, match="mrope_section"):
            parse_config(raw)
        return
    assert _ours(raw) == want


@pytest.mark.parametrize("variant", sorted(REFUSED))
@pytest.mark.parametrize("kind", sorted(ASSETS))
def test_what_transformers_refuses_is_refused_by_name(kind, variant, tmp_path):
    raw = _variant(kind, REFUSED[variant])
    with pytest.raises(Exception):  # noqa: B017 (its own error types: strict-field, KeyError, TypeError)
        _hf(raw, tmp_path)
    field = {"tie_top_null": "tie_word_embeddings"}.get(variant, variant[:-len("_null")])
    with pytest.raises(ModelLoadError, match=field):
        parse_config(raw)


@pytest.mark.parametrize("kind", ["qwen3_vl", "qwen3_vl_moe"])
def test_qwen3_rope_type_mrope_is_refused_as_transformers_does(kind, tmp_path):
    raw = _variant(kind, lambda r, t: _rope(t).update(rope_type="mrope"))  # only Qwen2's config renames it
    with pytest.raises(KeyError, match="mrope"):
        _hf(raw, tmp_path)
    with pytest.raises(ModelLoadError, match="mrope"):
        parse_config(raw)


def test_save_pretrained_moe_layout_is_untied():
    """5.24's save_pretrained writes top-level false (the composite default) and text_config true (its default)."""
    raw = _variant("qwen3_vl_moe", _set_tie(False, True))
    assert parse_config(raw).tie_word_embeddings is False
    raw = _variant("qwen3_vl_moe", lambda r, t: (r.update(eos_token_id=3002), t.update(eos_token_id=None)))
    assert parse_config(raw).eos_token_id == 3002
