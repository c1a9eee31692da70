"""Qwen-family tensor names (Qwen2-VL, Qwen2.5-VL, Qwen3-VL (+MoE), Qwen3.5 (+MoE); legacy and new layouts) ->
QwenVLModel parameters: prefixes, Qwen3-VL's vision renames, fused q/k/v, gate/up and DeltaNet projections, and
Qwen3.5-MoE's per-expert tensors as parts of the stacked experts."""

from __future__ import annotations

import re

PATCH_EMBED = "visual.patch_embed.weight"
# What transformers drops without a word (PreTrainedModel._adjust_missing_and_unexpected_keys): rotary_emb.inv_freq,
# since every family has such a buffer; these models set no _keys_to_ignore_on_load_unexpected and hold no
# position_ids buffer, so every other unknown name (visual.rotary_pos_emb.inv_freq too) is an unexpected tensor.
HF_IGNORED = re.compile(r"rotary_emb\.inv_freq")
EXPERTS = (".experts.gate_up_proj", ".experts.down_proj")  # fused [E, out, in]; the hub stores [E, in, out]
_MERGERS = r"^(visual\.(?:merger|deepstack_merger_list\.\d+))\."
# Qwen3-VL vision names -> the shared Qwen2-VL modules they load into
RENAMES = ((re.compile(r"^(visual\.blocks\.\d+\.mlp)\.linear_fc([12])\."), r"\1.fc\2."),
           (re.compile(_MERGERS + r"norm\."), r"\1.ln_q."),
           (re.compile(_MERGERS + r"linear_fc1\."), r"\1.mlp.0."),
           (re.compile(_MERGERS + r"linear_fc2\."), r"\1.mlp.2."))


# HF projection name -> (our fused module, part index); in_proj_*: Qwen3.5's gated DeltaNet projections
FUSED_PARTS = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
               "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1), "in_proj_qkv": ("in_proj", 0),
               "in_proj_z": ("in_proj", 1), "in_proj_b": ("in_proj", 2), "in_proj_a": ("in_proj", 3)}
# one expert's tensor (Qwen3.5-MoE's hub layout) -> a part of the stacked parameter (Experts.part_view)
EXPERT = re.compile(r"^(language\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def hf_target(name: str) -> tuple[str, int | None] | None:
    """HF tensor name -> (our parameter name, part of a fused parameter or None); None for tensors we drop."""
    internal = _hf_name(name)
    if internal is None:
        return None
    if m := EXPERT.match(internal):
        expert, proj = int(m.group(2)), m.group(3)
        if proj == "down_proj":
            return f"{m.group(1)}.down_proj", expert
        return f"{m.group(1)}.gate_up_proj", 2 * expert + (proj == "up_proj")
    module_path, _, leaf = internal.rpartition(".")
    parent, _, module = module_path.rpartition(".")
    if module in FUSED_PARTS:
        fused, part = FUSED_PARTS[module]
        return f"{parent}.{fused}.{leaf}", part
    return internal, None


def hf_to_internal(name: str) -> str | None:
    """Map an HF tensor name (either layout) to our parameter name (fused for q/k/v and gate/up); None: dropped."""
    target = hf_target(name)
    return None if target is None else target[0]


def _hf_name(name: str) -> str | None:
    if name.startswith("model.visual."):
        name = name[len("model.") :]
    elif name.startswith("model.language_model."):
        name = "language." + name[len("model.language_model.") :]
    elif name.startswith("model."):
        name = "language." + name[len("model.") :]
    if name == "visual.patch_embed.proj.weight":
        return PATCH_EMBED
    if name == "visual.patch_embed.proj.bias":
        return "visual.patch_embed.bias"
    if HF_IGNORED.search(name):
        return None
    for pattern, repl in RENAMES:
        name = pattern.sub(repl, name)
    return name


