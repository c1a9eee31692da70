"""RADIO vision tower as Nemotron Omni uses it (HF `radio`, its input conditioner removed): patch embedding with the
learned position table resampled to each image's grid, cls and register tokens, bidirectional ViT blocks within
each image, the prefix tokens dropped; then Omni's pixel shuffle and relu^2 projector."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mm_infer.models.half_linear import Linear
from mm_infer.models.layers import FusedLinear
from mm_infer.models.nemotron_h import NemotronRMSNorm
from mm_infer.models.nemotron_moe import relu2


@dataclass(frozen=True)
class RadioConfig:
    hidden: int
    layers: int
    heads: int
    mlp: int  # fc1 width: int(hidden * mlp_ratio)
    patch: int
    max_img_size: int
    prefix: int  # num_cls_tokens + num_registers: dropped from every image's output
    eps: float = 1e-6
    qkv_bias: bool = True
    channels: int = 3
    temporal_patch: int | None = None  # video: frames per tubelet, stacked on the channels

    @property
    def table_side(self) -> int:  # the position table is table_side x table_side
        return self.max_img_size // self.patch


class RadioBlock(nn.Module):
    """h + ls1 * attn(LN1 h); h + ls2 * fc2(gelu(fc1(LN2 h))), attention over one image's tokens."""

    def __init__(self, cfg: RadioConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.norm2 = nn.LayerNorm(cfg.hidden, eps=cfg.eps)
        self.qkv = FusedLinear(cfg.hidden, (cfg.hidden,) * 3, bias=cfg.qkv_bias)  # HF: q/k/v_proj; hub: attn.qkv
        self.o_proj = Linear(cfg.hidden, cfg.hidden, bias=True)
        self.fc1 = Linear(cfg.hidden, cfg.mlp, bias=True)
        self.fc2 = Linear(cfg.mlp, cfg.hidden, bias=True)
        self.ls1 = nn.Parameter(torch.ones(cfg.hidden))  # LayerScale, 1 unless a checkpoint says otherwise
        self.ls2 = nn.Parameter(torch.ones(cfg.hidden))

    def attend(self, x: Tensor, lens: list[int]) -> Tensor:  # [T, D] -> [T, D], each image on its own
        t, d = x.shape
        q, k, v = (p.reshape(t, self.heads, -1).transpose(0, 1) for p in self.qkv.forward_parts(x))
        out = torch.cat([F.scaled_dot_product_attention(q[:, s], k[:, s], v[:, s])  # [heads, n, hd]
                         for s in _spans(lens)], dim=1)
        return self.o_proj(out.transpose(0, 1).reshape(t, d))

    def forward(self, x: Tensor, lens: list[int]) -> Tensor:
        x = x + self.ls1 * self.attend(self.norm1(x), lens)
        return x + self.ls2 * self.fc2(F.gelu(self.fc1(self.norm2(x))))


def _spans(lens: list[int]) -> list[slice]:
    out, start = [], 0
    for n in lens:
        out.append(slice(start, start + n))
        start += n
    return out


class RadioTower(nn.Module):
    def __init__(self, cfg: RadioConfig) -> None:
        super().__init__()
        self.cfg = cfg
        patch_dim = cfg.channels * cfg.patch * cfg.patch
        self.patch_projection = Linear(patch_dim, cfg.hidden, bias=False)
        self.video_patch_projection = (Linear(patch_dim * cfg.temporal_patch, cfg.hidden, bias=False)
                                       if cfg.temporal_patch else None)
        self.position_embedding = nn.Parameter(torch.zeros(1, cfg.table_side ** 2, cfg.hidden))
        self.cls_register_token = nn.Parameter(torch.zeros(cfg.prefix, cfg.hidden))
        self.blocks = nn.ModuleList(RadioBlock(cfg) for _ in range(cfg.layers))

    def positions(self, gh: int, gw: int, dtype: torch.dtype) -> Tensor:
        """The table resampled bilinearly to a square of the grid's larger side, its top-left gh x gw kept:
        [gh * gw, D] row-major."""
        side = self.cfg.table_side
        table = self.position_embedding.reshape(1, side, side, -1).permute(0, 3, 1, 2).float()
        m = max(gh, gw)
        table = F.interpolate(table, size=(m, m), mode="bilinear", align_corners=False).to(dtype)
        return table[0, :, :gh, :gw].flatten(1).t()

    def forward(self, patches: Tensor, grids: list[tuple[int, int]], video: bool = False) -> Tensor:
        """Normalised patches [sum gh*gw, patch_dim] of images (or tubelets) with these grids -> features
        [sum gh*gw, D], the prefix tokens dropped."""
        proj = self.video_patch_projection if video else self.patch_projection
        assert proj is not None, "this tower has no video patch projection"
        emb = proj(patches)
        parts, lens = [], []
        for (gh, gw), rows in zip(grids, emb.split([h * w for h, w in grids]), strict=True):
            parts += [self.cls_register_token.to(emb.dtype), rows + self.positions(gh, gw, emb.dtype)]
            lens.append(gh * gw + self.cfg.prefix)
        x = torch.cat(parts)
        for block in self.blocks:
            x = block(x, lens)
        keep = torch.cat([torch.arange(s.start + self.cfg.prefix, s.stop) for s in _spans(lens)])
        return x[keep.to(x.device)]


def pixel_shuffle(x: Tensor, gh: int, gw: int) -> Tensor:
    """HF Omni's pixel shuffle at ratio 0.5: features [gh * gw, C] -> [(gh/2) * (gw/2), 4C], each output the
    2x2 neighbourhood (row offset outer, column offset inner)."""
    c = x.shape[-1]
    x = x.view(1, gh, gw // 2, 2 * c).transpose(1, 2).contiguous()  # HF's view/transpose sequence, verbatim
    x = x.view(1, gw // 2, gh // 2, 4 * c).transpose(1, 2).contiguous()
    return x.reshape(-1, 4 * c)


class OmniProjector(nn.Module):
    """linear_2(relu(linear_1(RMSNorm(x)))^2), no biases (HF's multi_modal_projector)."""

    def __init__(self, dim: int, hidden: int, out: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.layer_norm = NemotronRMSNorm(dim, eps)
        self.linear_1 = Linear(dim, hidden, bias=False)
        self.linear_2 = Linear(hidden, out, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(relu2(self.linear_1(self.layer_norm(x))))


class OmniVision(nn.Module):
    """Images -> LM embeddings: tower, optional final LayerNorm, pixel shuffle per image, projector."""

    def __init__(self, tower: RadioConfig, projector_hidden: int, text_hidden: int, final_norm: bool) -> None:
        super().__init__()
        self.tower = RadioTower(tower)
        self.final_norm = nn.LayerNorm(tower.hidden, eps=tower.eps) if final_norm else None
        self.projector = OmniProjector(4 * tower.hidden, projector_hidden, text_hidden)

    def forward(self, patches: Tensor, grids: list[tuple[int, int]]) -> Tensor:
        """[sum gh*gw, patch_dim] -> [sum gh*gw / 4, text hidden], images in order."""
        feats = self.tower(patches, grids)
        if self.final_norm is not None:
            feats = self.final_norm(feats)
        shuffled = [pixel_shuffle(f, gh, gw) for f, (gh, gw) in zip(feats.split([h * w for h, w in grids]), grids,
                                                                       strict=True)]
        return self.projector(torch.cat(shuffled))

    def video(self, tubelets: Tensor) -> Tensor:
        """One video's tubelets [n, T*C, H, W] (T frames stacked frame-major on the channels, normalised) ->
        [n * (H/16) * (W/16) / 4, text hidden]: every tubelet is its own sequence through the video projection."""
        n, ch, height, width = tubelets.shape
        p = self.tower.cfg.patch
        gh, gw = height // p, width // p
        patches = tubelets.reshape(n, ch, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(n * gh * gw, ch * p * p)
        return self.video_rows(patches, n, gh, gw)

    def video_rows(self, patches: Tensor, n: int, gh: int, gw: int) -> Tensor:
        """Tubelet patch rows [n * gh * gw, T*C*p*p] (channel index t*C + c, then py, px) -> [n * gh * gw / 4, D]."""
        feats = self.tower(patches, [(gh, gw)] * n, video=True)
        if self.final_norm is not None:
            feats = self.final_norm(feats)
        return self.projector(torch.cat([pixel_shuffle(f, gh, gw) for f in feats.split(gh * gw)]))


def omni_vision_name(hf_name: str) -> tuple[str, int | None] | None:
    """HF Omni's vision and projector parameter names (transformers' own) -> (OmniVision's name, part of the fused
    qkv or None); None for any other name."""
    for old, new in (("vision_model.embeddings.", "tower."), ("vision_model.encoder.layer.", "tower.blocks."),
                     ("multi_modal_projector.", "projector."), ("vision_final_layernorm.", "final_norm.")):
        if hf_name.startswith(old):
            name = new + hf_name[len(old):]
            for a, b in ((".attention.", "."), (".mlp.", "."), (".layer_scale1.lambda1", ".ls1"),
                         (".layer_scale2.lambda1", ".ls2")):
                name = name.replace(a, b)
            for part, proj in enumerate((".q_proj.", ".k_proj.", ".v_proj.")):
                if proj in name:
                    return name.replace(proj, ".qkv."), part
            return name, None
    return None
