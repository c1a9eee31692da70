"""Nemotron Omni tensor names -> NemotronOmniModel parameters: the hub's released layout (`language_model.backbone.*`,
`vision_model.radio_model.model.*`, `mlp1.*`, `sound_encoder.*`, one tensor per expert, fused qkv) and transformers'
own names; the MTP head and the audio featurizer are skipped by name, exactly where transformers skips them."""

from __future__ import annotations

import re

from mm_infer.models.parakeet import omni_audio_name
from mm_infer.models.radio import omni_vision_name

MTP = re.compile(r"(^|\.)mtp\.")  # NemotronH's _keys_to_ignore_on_load_unexpected = [r"mtp.*"]
EXPERT = re.compile(r"^(language\.layers\.\d+\.mixer)\.experts\.(\d+)\.(up_proj|down_proj)\.weight$")
FUSED_EXPERTS = re.compile(r"^(language\.layers\.\d+\.mixer)\.experts\.(up_proj|down_proj)$")
# the hub's vision and projector names -> transformers' (conversion_mapping's radio / omni rules, reversed)
RELEASED_VISION = (
    (re.compile(r"^vision_model\.radio_model\.model\.patch_generator\.embedder\."),
     "vision_model.embeddings.patch_projection."),
    (re.compile(r"^vision_model\.radio_model\.model\.patch_generator\.video_embedder\."),
     "vision_model.embeddings.video_patch_projection."),
    (re.compile(r"^vision_model\.radio_model\.model\.patch_generator\.pos_embed$"),
     "vision_model.embeddings.position_embedding"),
    (re.compile(r"^vision_model\.radio_model\.model\.patch_generator\.cls_token\.token$"),
     "vision_model.embeddings.cls_register_token"),
    (re.compile(r"^vision_model\.radio_model\.model\.blocks\.(\d+)\.attn\.proj\."),
     r"vision_model.encoder.layer.\1.attention.o_proj."),
    (re.compile(r"^vision_model\.radio_model\.model\.blocks\.(\d+)\.(norm[12]|mlp|layer_scale[12])\."),
     r"vision_model.encoder.layer.\1.\2."),
    (re.compile(r"^mlp1\.0\."), "multi_modal_projector.layer_norm."),
    (re.compile(r"^mlp1\.1\."), "multi_modal_projector.linear_1."),
    (re.compile(r"^mlp1\.3\."), "multi_modal_projector.linear_2."),
    (re.compile(r"^vision_projector\.vision_final_layernorm\."), "vision_final_layernorm."),
)
QKV = re.compile(r"^vision_model\.radio_model\.model\.blocks\.(\d+)\.attn\.qkv\.(weight|bias)$")
DROPPED = re.compile(r"^vision_model\.(radio_model\.)?(summary_idxs|input_conditioner\.)")  # unused by Omni


def omni_target(name: str) -> tuple[str, int | None] | None:
    """A stored tensor name -> (our parameter, part of a fused parameter or None); None: skipped by name."""
    name = name.removeprefix("model.")
    if MTP.search(name) or DROPPED.match(name):
        return None
    if name.startswith(("audio_tower.", "embed_audio.", "sound_encoder.", "sound_projection.")):
        audio = omni_audio_name(name)
        return None if audio is None else ("audio." + audio, None)
    if name.startswith(("language_model.backbone.", "language_model.model.")):
        return _language("language." + name.split(".", 2)[2])
    if name.startswith("language_model.lm_head."):
        return "language." + name.removeprefix("language_model."), None
    if m := QKV.match(name):
        return f"vision.tower.blocks.{m.group(1)}.qkv.{m.group(2)}", None
    for pattern, repl in RELEASED_VISION:
        name = pattern.sub(repl, name)
    target = omni_vision_name(name)
    if target is None:
        return name, None  # names nothing of ours: the loader refuses it as unexpected
    return "vision." + target[0], target[1]


def _language(name: str) -> tuple[str, int | None]:
    if m := EXPERT.match(name):  # one tensor per expert: its row of the stacked [E, ...] parameter
        return f"{m.group(1)}.{m.group(3)}", int(m.group(2))
    if m := FUSED_EXPERTS.match(name):  # transformers' stacked experts
        return f"{m.group(1)}.{m.group(2)}", None
    return name, None
