"""Qwen3-VL geometry (patch 16, mean = std = 0.5) through the Triton patchify and patch-embed kernels (the
interpreter on CPU): HF's Qwen3-VL image processor and patch embedding are the oracles, bit for bit where possible."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from kernel_cases import REPO, frames_u8, packed_with_gaps
from PIL import Image

from mm_infer.media.patchify import PatchSpec, frames_to_rows
from mm_infer_kernels import dispatch
from mm_infer_kernels.fused_patch_embed import patch_embed_triton, patch_embed_two_pass_triton
from mm_infer_kernels.fused_patchify import patchify_packed_triton, patchify_triton

CKPT = REPO / "assets" / "models" / "tiny-qwen3-vl"
SPEC = PatchSpec.from_config(json.loads((CKPT / "preprocessor_config.json").read_text()))
GEO = SPEC.geometry
SHAPES = [(64, 64), (96, 128), (64, 160), (160, 96)]  # multiples of 32 at or above min_pixels: HF does not resize


def test_spec_is_patch_16():
    assert (GEO.patch_size, GEO.temporal_patch_size, GEO.merge_size, GEO.width) == (16, 2, 2, 1536)
    assert SPEC.image_mean == SPEC.image_std == (0.5, 0.5, 0.5)


@pytest.fixture(scope="module")
def hf_images():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil.from_pretrained(CKPT)  # what Qwen3VLProcessor uses for images (PIL backend)


@pytest.mark.parametrize("hw", SHAPES)
def test_patchify_equals_hf_qwen3_image_processor(hf_images, hw, device):
    frame = frames_u8(1, *hw, seed=hw[0])  # [1, H, W, 3]
    ref = hf_images(images=[Image.fromarray(frame[0].numpy())], return_tensors="pt")
    assert ref["image_grid_thw"].tolist() == [list(GEO.grid((1, *hw)))]
    out = patchify_triton(frame.to(device), norm=SPEC.normalizer("pil"), geometry=GEO).cpu()
    assert out.shape == ref["pixel_values"].shape == (hw[0] * hw[1] // 256, 1536)
    assert torch.equal(out, ref["pixel_values"])
    bf16 = patchify_triton(frame.to(device), norm=SPEC.normalizer("pil"), geometry=GEO, out_dtype=torch.bfloat16)
    assert torch.equal(bf16.cpu(), ref["pixel_values"].to(torch.bfloat16))


@pytest.mark.parametrize("backend", ["torchvision", "pil"])
def test_packed_images_and_odd_videos_equal_the_cpu_preprocessing(backend, device):
    """The engine's CPU path (frames_to_rows, itself HF-exact in tests/media) for items of 1, 3 and 4 frames."""
    items = [frames_u8(1, 64, 96, seed=1), frames_u8(3, 64, 64, seed=2), frames_u8(4, 96, 32, seed=3)]
    buf, offs, thw = packed_with_gaps(items)
    out = patchify_packed_triton(buf.to(device), offs, thw, norm=SPEC.normalizer(backend), geometry=GEO).cpu()
    ref = [frames_to_rows(f.permute(0, 3, 1, 2).contiguous(), backend, SPEC) for f in items]
    assert [g for _, g in ref] == [GEO.grid(s) for s in thw]
    assert torch.equal(out, torch.cat([rows for rows, _ in ref]))


def test_dispatch_forced_to_triton_runs_the_interpreter(monkeypatch, device):
    frames = frames_u8(3, 64, 96)
    auto = dispatch.patchify(frames, norm=SPEC.normalizer("pil"), geometry=GEO)  # torch reference on CPU
    monkeypatch.setenv("MM_INFER_KERNELS", "triton")
    assert dispatch.select_backend(frames.to(device)) == "triton"
    assert torch.equal(dispatch.patchify(frames.to(device), norm=SPEC.normalizer("pil"), geometry=GEO).cpu(), auto)


def _hf_patch_embed():
    from safetensors import safe_open
    from transformers import AutoConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionPatchEmbed

    embed = Qwen3VLVisionPatchEmbed(AutoConfig.from_pretrained(CKPT).vision_config).eval()
    with safe_open(str(CKPT / "model.safetensors"), "pt") as f:
        embed.proj.weight.data = f.get_tensor("model.visual.patch_embed.proj.weight")  # [64, 3, 2, 16, 16]
        embed.proj.bias.data = f.get_tensor("model.visual.patch_embed.proj.bias")
    return embed


@torch.no_grad()
def test_patch_embed_equals_hf_qwen3_patch_embed(hf_images, device):
    embed = _hf_patch_embed()
    weight, bias = embed.proj.weight.detach(), embed.proj.bias.detach()
    assert tuple(weight.shape) == (64, 3, 2, 16, 16)
    frame = frames_u8(1, 96, 128, seed=5)
    pixels = hf_images(images=[Image.fromarray(np.ascontiguousarray(frame[0].numpy()))],
                       return_tensors="pt")["pixel_values"]
    ref = embed(pixels)  # HF: rows -> Conv3d (+ bias)
    norm = SPEC.normalizer("pil")
    fused = patch_embed_triton(frame.to(device), weight.to(device), norm=norm, geometry=GEO).cpu() + bias
    assert (fused - ref).abs().max().item() <= 2e-5 * ref.abs().max().item()
    two_pass = patch_embed_two_pass_triton(*dispatch.pack_frames([frame.to(device)]), weight.to(device), norm=norm,
                                           geometry=GEO).cpu()
    assert torch.equal(two_pass, dispatch.patch_embed_rows(pixels, weight.reshape(64, -1)))  # the engine's CPU maths
