"""Nemotron Omni's vision path (RADIO tower, pixel shuffle, projector) against HF's get_image_features in float32,
on a tiny random omni model: one image, several of different grids, and the final LayerNorm when present."""

from __future__ import annotations

import pytest
import torch

from mm_infer.models.radio import OmniVision, RadioConfig, omni_vision_name

TEXT = {"model_type": "nemotron_h", "vocab_size": 128, "hidden_size": 64, "hybrid_override_pattern": "M*E",
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
        "mamba_num_heads": 8, "mamba_head_dim": 16, "ssm_state_size": 16, "n_groups": 2, "conv_kernel": 4,
        "chunk_size": 8, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "moe_shared_expert_intermediate_size": 48, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
VISION = {"model_type": "radio", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "mlp_ratio": 4.0, "patch_size": 16, "max_img_size": 256, "num_cls_tokens": 3, "num_registers": 7,
          "video_temporal_patch_size": 2, "qkv_bias": True, "hidden_act": "gelu", "layer_norm_eps": 1e-6}


def hf_omni(final_norm: bool):
    from transformers import AutoModelForImageTextToText
    from transformers.models.nemotron_h_omni.configuration_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3_Config,
    )

    cfg = NemotronH_Omni_Reasoning_V3_Config(
        downsample_ratio=0.5, projector_hidden_size=48, vision_hidden_size=32, video_temporal_patch_size=2,
        img_context_token_id=10, llm_config={**TEXT, "num_nextn_predict_layers": int(final_norm)},
        vision_config=VISION)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(cfg).float().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # HF's init: zero tables and tokens, unit scales; move them all off
        for name, p in model.named_parameters():
            if not name.startswith(("model.language_model", "language_model")):
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
    return model


def ours_from(hf, final_norm: bool) -> OmniVision:
    cfg = RadioConfig(hidden=32, layers=2, heads=4, mlp=128, patch=16, max_img_size=256, prefix=10, temporal_patch=2)
    ours = OmniVision(cfg, projector_hidden=48, text_hidden=64, final_norm=final_norm).float().eval()
    params, filled = dict(ours.named_parameters()), set()
    with torch.no_grad():
        for name, t in hf.state_dict().items():
            if (target := omni_vision_name(name.removeprefix("model."))) is not None:
                mine, part = target
                view = params[mine] if part is None else params[mine].narrow(0, part * 32, 32)
                view.copy_(t)
                filled.add((mine, part))
    assert {name for name, _ in filled} == set(params)
    return ours


@pytest.mark.parametrize("final_norm", [False, True], ids=["no-final-norm", "final-norm"])
@pytest.mark.parametrize("grids", [[(4, 6)], [(4, 6), (2, 2), (6, 4), (16, 10)]], ids=["one", "four"])
@torch.no_grad()
def test_image_features_equal_hf(grids, final_norm):
    # catches: position table resampled or cropped wrongly, tokens attending across images, the prefix kept,
    # the shuffle's channel order, the projector's norm order, the LayerScale or final norm skipped
    hf = hf_omni(final_norm)
    ours = ours_from(hf, final_norm)
    patches = torch.randn(sum(h * w for h, w in grids), 768, generator=torch.Generator().manual_seed(2))
    want = torch.cat(hf.get_image_features(patches, torch.tensor(grids)).pooler_output)
    got = ours(patches, grids)
    assert got.shape == (sum(h * w // 4 for h, w in grids), 64)
    assert (got - want).abs().max().item() <= 1e-4  # the bound; features reach |30|, float32 rounding ~1e-5


@torch.no_grad()
def test_video_tubelets_equal_hf():
    # catches: the tubelet's channels read in the wrong order, tubelets attending to each other, or the image
    # projection used for video
    hf = hf_omni(False)
    ours = ours_from(hf, False)
    video = torch.randn(1, 3, 6, 32, 64, generator=torch.Generator().manual_seed(3))  # 3 tubelets, 2x4 patch grid
    want = hf.get_video_features(video).pooler_output[0]
    got = ours.video(video[0])
    assert got.shape == (3 * 2, 64) and (got - want).abs().max().item() <= 1e-4
