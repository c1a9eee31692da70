"""Checkpoint loading: both tensor-name layouts, dtypes, in-place refit, and clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from model_cases import CHECKPOINTS, build_prompt, max_diff, our_logits
from safetensors.torch import load_file, save_file

from mm_infer.models import (
    MissingTensorError,
    ShapeMismatchError,
    UnexpectedTensorError,
    UnknownArchitectureError,
    UnsupportedConfigError,
    hf_to_internal,
    load_model,
    load_state_dict_into,
)
from mm_infer.models.loader import iter_safetensors


def copy_checkpoint(src: Path, dst: Path, edit=None, config_edit=None) -> Path:
    """Copy a checkpoint folder, optionally editing its tensors dict and config dict."""
    shutil.copytree(src, dst)
    if edit is not None:
        tensors = load_file(str(src / "model.safetensors"))
        edit(tensors)
        save_file(tensors, str(dst / "model.safetensors"))
    if config_edit is not None:
        cfg = json.loads((src / "config.json").read_text())
        config_edit(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def to_other_layout(tensors: dict) -> None:
    """Rename legacy names to the new layout or the reverse, in place."""
    for name in list(tensors):
        if name.startswith("visual."):
            new = "model." + name
        elif name.startswith("model.visual."):
            new = name[len("model."):]
        elif name.startswith("model.language_model."):
            new = "model." + name[len("model.language_model."):]
        elif name.startswith("model."):
            new = "model.language_model." + name[len("model."):]
        else:
            continue
        tensors[new] = tensors.pop(name)


def test_hf_loads_tiny_checkpoints_without_missing_or_unexpected_keys(kind):
    from transformers import AutoModelForImageTextToText

    _, info = AutoModelForImageTextToText.from_pretrained(CHECKPOINTS[kind], output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]


def test_both_name_layouts_load_to_identical_parameters(kind, ours, tmp_path):
    model, _ = ours
    other, _ = load_model(copy_checkpoint(CHECKPOINTS[kind], tmp_path / "ck", edit=to_other_layout))
    theirs = dict(other.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p, theirs[name]), name


def test_every_parameter_comes_from_the_checkpoint(kind, ours):
    model, cfg = ours
    tensors = load_file(str(CHECKPOINTS[kind] / "model.safetensors"))
    mapped = {hf_to_internal(n) for n in tensors}
    assert mapped == {n for n, _ in model.named_parameters()}
    assert (model.lm_head is None) == cfg.tie_word_embeddings
    assert ("lm_head.weight" in tensors) != cfg.tie_word_embeddings


def test_refit_in_place_changes_outputs_and_restores(kind, ours):
    """load_state_dict_into copies new weights into the same parameter storage (RL weight refit)."""
    model, cfg = ours
    prompt = build_prompt(cfg, [4, ("image", 1, 4, 4), 3], seed=7)
    before = our_logits(model, cfg, prompt)
    tensors = load_file(str(CHECKPOINTS[kind] / "model.safetensors"))
    qkv = next(n for n in tensors if n.endswith("blocks.0.attn.qkv.weight"))
    ptr = dict(model.named_parameters())[hf_to_internal(qkv)].data_ptr()
    try:
        assert load_state_dict_into(model, [(qkv, tensors[qkv] * 2.0)]) == {hf_to_internal(qkv)}
        assert dict(model.named_parameters())[hf_to_internal(qkv)].data_ptr() == ptr
        assert max_diff(our_logits(model, cfg, prompt), before) > 1e-3
    finally:
        load_state_dict_into(model, tensors, strict=True)
    assert max_diff(our_logits(model, cfg, prompt), before) == 0.0


def test_bfloat16_checkpoint_on_disk_loads_as_float32(tmp_path):
    src = CHECKPOINTS["qwen2_vl"]
    dst = copy_checkpoint(src, tmp_path / "bf16", edit=lambda t: t.update({k: v.bfloat16() for k, v in t.items()}))
    model, _ = load_model(dst, dtype=torch.float32)
    ref = load_file(str(src / "model.safetensors"))["model.norm.weight"]
    assert model.language.norm.weight.dtype == torch.float32
    assert torch.equal(model.language.norm.weight, ref.bfloat16().float())


def test_missing_tensor_is_named(tmp_path):
    name = "model.layers.1.mlp.up_proj.weight"
    ck = copy_checkpoint(CHECKPOINTS["qwen2_vl"], tmp_path / "ck", edit=lambda t: t.pop(name))
    with pytest.raises(MissingTensorError, match=r"language\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(ck)


def test_untied_checkpoint_without_lm_head_is_missing_tensor(tmp_path):
    ck = copy_checkpoint(CHECKPOINTS["qwen2_vl"], tmp_path / "ck", edit=lambda t: t.pop("lm_head.weight"))
    with pytest.raises(MissingTensorError, match="lm_head.weight"):
        load_model(ck)


def test_wrong_shape_is_named(tmp_path):
    name = "visual.blocks.0.attn.proj.weight"
    edit = lambda t: t.update({name: t[name][:, :32].contiguous()})  # noqa: E731
    ck = copy_checkpoint(CHECKPOINTS["qwen2_vl"], tmp_path / "ck", edit=edit)
    with pytest.raises(ShapeMismatchError, match=rf"{name}.*\(64, 32\).*\(64, 64\)"):
        load_model(ck)


def test_unexpected_tensor_is_named(tmp_path):
    edit = lambda t: t.update({"model.layers.9.extra.weight": t["model.norm.weight"].clone()})  # noqa: E731
    ck = copy_checkpoint(CHECKPOINTS["qwen2_vl"], tmp_path / "ck", edit=edit)
    with pytest.raises(UnexpectedTensorError, match=r"model\.layers\.9\.extra\.weight"):
        load_model(ck)


def test_unknown_architecture_is_named(tmp_path):
    def edit(cfg: dict) -> None:
        cfg["architectures"] = ["LlavaForConditionalGeneration"]
        cfg["model_type"] = "llava"

    ck = copy_checkpoint(CHECKPOINTS["qwen2_vl"], tmp_path / "ck", config_edit=edit)
    with pytest.raises(UnknownArchitectureError, match="LlavaForConditionalGeneration"):
        load_model(ck)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("use_sliding_window", True, "use_sliding_window"), ("rope_scaling", {"type": "yarn", "factor": 4.0}, "yarn")],
)
def test_unsupported_config_is_named(tmp_path, field, value, message):
    ck = copy_checkpoint(CHECKPOINTS["qwen2_vl"], tmp_path / "ck", config_edit=lambda c: c.update({field: value}))
    with pytest.raises(UnsupportedConfigError, match=message):
        load_model(ck)


def test_fused_projections_refit_by_hf_name_touch_only_their_rows(kind, ours):
    # catches: a part written at the wrong offset of qkv_proj / gate_up_proj, or over its neighbours
    model, _ = ours
    tensors = load_file(str(CHECKPOINTS[kind] / "model.safetensors"))
    params = dict(model.named_parameters())
    q_name = next(n for n in tensors if n.endswith("layers.0.self_attn.k_proj.weight"))
    up_name = next(n for n in tensors if n.endswith("layers.1.mlp.up_proj.weight"))
    qkv, gate_up = params[hf_to_internal(q_name)], params[hf_to_internal(up_name)]
    before_qkv, before_gate_up = qkv.clone(), gate_up.clone()
    q_rows, k_rows = tensors[q_name.replace("k_proj", "q_proj")].shape[0], tensors[q_name].shape[0]
    hidden = tensors[up_name].shape[0]
    try:
        load_state_dict_into(model, [(q_name, torch.full_like(tensors[q_name], 7.0)),
                                     (up_name, torch.full_like(tensors[up_name], -3.0))])
        assert torch.equal(qkv[:q_rows], before_qkv[:q_rows]) and (qkv[q_rows:q_rows + k_rows] == 7.0).all()
        assert torch.equal(qkv[q_rows + k_rows:], before_qkv[q_rows + k_rows:])
        assert torch.equal(gate_up[:hidden], before_gate_up[:hidden]) and (gate_up[hidden:] == -3.0).all()
    finally:
        load_state_dict_into(model, tensors, strict=True)
    assert torch.equal(qkv, before_qkv) and torch.equal(gate_up, before_gate_up)


def test_load_adopts_matching_file_tensors_without_copying(kind):
    # catches: a load that copies every tensor (startup time), or a fused parameter adopted from parts that do not
    # lie back to back in part order (q/k/v: k_proj comes first in the file, o_proj between)
    tensors = dict(iter_safetensors(CHECKPOINTS[kind]))
    model, _ = load_model(CHECKPOINTS[kind])
    load_state_dict_into(model, tensors, strict=True, adopt=True)
    embed = next(n for n in tensors if n.endswith("embed_tokens.weight"))
    q = next(n for n in tensors if n.endswith("layers.0.self_attn.q_proj.weight"))
    gate = next(n for n in tensors if n.endswith("layers.0.mlp.gate_proj.weight"))
    up = gate.replace("gate_proj", "up_proj")
    params = dict(model.named_parameters())
    assert params[hf_to_internal(embed)].data_ptr() == tensors[embed].data_ptr()
    assert params[hf_to_internal(q)].data_ptr() != tensors[q].data_ptr()
    assert torch.equal(params[hf_to_internal(q)][:tensors[q].shape[0]], tensors[q])
    gate_up = params[hf_to_internal(gate)]
    assert gate_up.data_ptr() == tensors[gate].data_ptr()  # gate_proj then up_proj in the file: one span, no copy
    assert torch.equal(gate_up, torch.cat([tensors[gate], tensors[up]]))


def test_mapped_tensors_equal_safetensors_and_refits_leave_the_file(tmp_path, kind):
    # catches: a wrong offset or dtype in the mapped reader, or a shared (MAP_SHARED) map that writes refits back
    src = copy_checkpoint(CHECKPOINTS[kind], tmp_path / "ckpt")
    reference = load_file(str(src / "model.safetensors"))
    mapped = dict(iter_safetensors(src))
    assert mapped.keys() == reference.keys()
    for name, tensor in reference.items():
        assert mapped[name].dtype == tensor.dtype and torch.equal(mapped[name], tensor), name
    before = (src / "model.safetensors").read_bytes()
    model, _ = load_model(src)
    gate = next(n for n in reference if n.endswith("layers.0.mlp.gate_proj.weight"))
    load_state_dict_into(model, [(gate, torch.full_like(reference[gate], 5.0))])  # refit into the adopted span
    assert (dict(model.named_parameters())[hf_to_internal(gate)][:reference[gate].shape[0]] == 5.0).all()
    assert (src / "model.safetensors").read_bytes() == before


def test_adjacent_span_needs_back_to_back_parts():
    from mm_infer.models.safetensors_map import adjacent_span

    base = torch.arange(24.0)
    a, b, c = base[0:6].view(2, 3), base[6:12].view(2, 3), base[15:21].view(2, 3)
    span = adjacent_span([a, b])
    assert span is not None and span.data_ptr() == a.data_ptr() and torch.equal(span, base[:12].view(4, 3))
    assert adjacent_span([b, a]) is None  # wrong order
    assert adjacent_span([a, c]) is None  # a gap
    assert adjacent_span([a, torch.arange(6.0, 12.0).view(2, 3)]) is None  # another storage
    assert adjacent_span([a, base[6:12].view(3, 2)]) is None  # another row width


def test_truncated_file_is_a_clear_error(tmp_path):
    src = copy_checkpoint(CHECKPOINTS["qwen2_vl"], tmp_path / "ckpt")
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) - 64])
    with pytest.raises(MissingTensorError, match="past the file"):
        list(iter_safetensors(src))
