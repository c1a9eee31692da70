"""Parakeet (FastConformer) audio encoder as Nemotron Omni uses it (HF `ParakeetEncoder` + `embed_audio`): 2-D conv
subsampling, Transformer-XL relative-position attention, macaron feed-forwards, the conv module with its batch norm
frozen; then Omni's relu^2 projector, one utterance's rows trimmed exactly as HF's get_audio_features trims them."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mm_infer.models.half_linear import Linear
from mm_infer.models.radio import OmniProjector

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"silu": F.silu, "swish": F.silu, "relu": F.relu,
                                                       "gelu": F.gelu}


@dataclass(frozen=True)
class AudioEncoderConfig:
    hidden: int
    layers: int
    heads: int
    ffn: int  # intermediate_size
    mel: int  # num_mel_bins
    sub_factor: int = 8  # subsampling_factor: log2 of it stride-s conv stages
    sub_channels: int = 256
    sub_kernel: int = 3
    sub_stride: int = 2
    conv_kernel: int = 9
    act: str = "silu"
    attention_bias: bool = False  # Omni's default (ParakeetEncoderConfig's own is True)
    conv_bias: bool = True
    scale_input: bool = False  # Omni's default (ParakeetEncoderConfig's own is True)
    projection_hidden: int = 4096
    projection_bias: bool = False

    @staticmethod
    def from_hf(cfg: Mapping[str, Any]) -> AudioEncoderConfig:
        """Omni's `audio_config` (legacy `sound_config`) dict; absent keys take ParakeetEncoderConfig's defaults,
        except attention_bias and scale_input, which Omni's config defaults to False."""
        if cfg.get("hidden_act", "silu") not in ACTIVATIONS:
            raise ValueError(f"audio hidden_act {cfg['hidden_act']!r} is not supported")
        if "projection_hidden_size" not in cfg:
            raise ValueError("audio_config has no projection_hidden_size (HF's embed_audio needs it)")
        return AudioEncoderConfig(
            hidden=int(cfg.get("hidden_size", 1024)), layers=int(cfg.get("num_hidden_layers", 24)),
            heads=int(cfg.get("num_attention_heads", 8)), ffn=int(cfg.get("intermediate_size", 4096)),
            mel=int(cfg.get("num_mel_bins", 80)), sub_factor=int(cfg.get("subsampling_factor", 8)),
            sub_channels=int(cfg.get("subsampling_conv_channels", 256)),
            sub_kernel=int(cfg.get("subsampling_conv_kernel_size", 3)),
            sub_stride=int(cfg.get("subsampling_conv_stride", 2)), conv_kernel=int(cfg.get("conv_kernel_size", 9)),
            act=str(cfg.get("hidden_act", "silu")), attention_bias=bool(cfg.get("attention_bias", False)),
            conv_bias=bool(cfg.get("convolution_bias", True)), scale_input=bool(cfg.get("scale_input", False)),
            projection_hidden=int(cfg["projection_hidden_size"]),
            projection_bias=bool(cfg.get("projection_bias", False)))

    @property
    def sub_layers(self) -> int:
        return int(math.log2(self.sub_factor))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


Lengths = TypeVar("Lengths", Tensor, int)


def conv_length(lengths: Lengths, kernel: int, stride: int) -> Lengths:
    """Valid frames after one stride-s conv with 'same' padding (k-1)//2 on both sides."""
    return (lengths + 2 * ((kernel - 1) // 2) - kernel) // stride + 1


def subsampled_length(lengths: Lengths, cfg: AudioEncoderConfig) -> Lengths:
    """Valid mel frames ([B] or one int) -> valid encoder frames (HF's _get_subsampling_output_length)."""
    for _ in range(cfg.sub_layers):
        lengths = conv_length(lengths, cfg.sub_kernel, cfg.sub_stride)
    return lengths


def rel_positions(t: int, dim: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Sinusoids of relative distances t-1 .. -(t-1): [2t-1, dim], sin and cos interleaved per frequency."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))  # [dim/2]
    dist = torch.arange(t - 1, -t, -1, device=device).float()  # [2t-1]
    freqs = dist[:, None] * inv_freq  # [2t-1, dim/2]
    return torch.stack([freqs.sin(), freqs.cos()], dim=-1).reshape(2 * t - 1, dim).to(dtype)


def rel_index(t: int, device: torch.device) -> Tensor:
    """[t, t] column into the [2t-1] distance axis for query i, key j: distance i - j sits at t-1-i+j."""
    ar = torch.arange(t, device=device)
    return (t - 1) - ar[:, None] + ar[None, :]


class Subsampling(nn.Module):
    """[B, T, mel] -> [B, T', hidden]: conv (1 -> C), then depthwise + pointwise pairs, ReLUs, every conv's output
    zeroed past the utterance's valid frames; (channel, mel) flattened channel-major into one linear."""

    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        c, k, s = cfg.sub_channels, cfg.sub_kernel, cfg.sub_stride
        pad = (k - 1) // 2
        layers: list[nn.Module] = [nn.Conv2d(1, c, k, s, pad), nn.ReLU()]  # HF's indices, so names load as-is
        for _ in range(cfg.sub_layers - 1):
            layers += [nn.Conv2d(c, c, k, s, pad, groups=c), nn.Conv2d(c, c, 1), nn.ReLU()]
        self.layers = nn.ModuleList(layers)
        self.linear = nn.Linear(c * (cfg.mel // s ** cfg.sub_layers), cfg.hidden, bias=True)

    def forward(self, feats: Tensor, lengths: Tensor) -> Tensor:
        x = feats.unsqueeze(1)  # [B, 1, T, mel]
        for layer in self.layers:
            x = layer(x)
            if isinstance(layer, nn.Conv2d):
                if layer.stride[0] != 1:
                    lengths = conv_length(lengths, self.cfg.sub_kernel, self.cfg.sub_stride)
                valid = torch.arange(x.shape[2], device=x.device) < lengths[:, None]  # [B, T_l]
                x = x * valid[:, None, :, None]
        b, c, t, f = x.shape
        return self.linear(x.transpose(1, 2).reshape(b, t, c * f))  # [B, T', hidden]


class RelPosAttention(nn.Module):
    """softmax((q+u)k^T + shift((q+v) (W_r p)^T)) v / sqrt(hd); masked pairs take float32 min in the position term
    (a row with no valid key then spreads evenly over every key, as HF's does)."""

    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.heads, self.hd = cfg.heads, cfg.head_dim
        d, bias = cfg.hidden, cfg.attention_bias
        self.q_proj, self.k_proj = Linear(d, d, bias=bias), Linear(d, d, bias=bias)
        self.v_proj, self.o_proj = Linear(d, d, bias=bias), Linear(d, d, bias=bias)
        self.relative_k_proj = Linear(d, d, bias=False)
        self.bias_u = nn.Parameter(torch.zeros(cfg.heads, cfg.head_dim))  # content bias
        self.bias_v = nn.Parameter(torch.zeros(cfg.heads, cfg.head_dim))  # position bias

    def forward(self, x: Tensor, pos: Tensor, mask: Tensor) -> Tensor:
        """x [B, T, D], pos [2T-1, D], mask [B, 1, T, T] (True: attend) -> [B, T, D]."""
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.heads, self.hd).transpose(1, 2) for p in (self.q_proj, self.k_proj,
                                                                                  self.v_proj))  # [B, H, T, hd]
        r = self.relative_k_proj(pos).view(2 * t - 1, self.heads, self.hd).permute(1, 2, 0)  # [H, hd, 2T-1]
        scale = self.hd ** -0.5
        bd = (q + self.bias_v[:, None]) @ r  # [B, H, T, 2T-1]
        bd = bd.gather(-1, rel_index(t, x.device).expand(b, self.heads, t, t)) * scale  # [B, H, T, T]
        bd = bd.masked_fill(mask.logical_not(), torch.finfo(bd.dtype).min)
        out = F.scaled_dot_product_attention(q + self.bias_u[:, None], k, v, attn_mask=bd, scale=scale)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, d))


class ConvModule(nn.Module):
    """pointwise (D -> 2D), GLU, padding frames zeroed, depthwise conv, batch norm on its running stats, act,
    pointwise; on [B, T, D]."""

    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        d, k, bias = cfg.hidden, cfg.conv_kernel, cfg.conv_bias
        self.act = ACTIVATIONS[cfg.act]
        self.pointwise_conv1 = nn.Conv1d(d, 2 * d, 1, bias=bias)
        self.depthwise_conv = nn.Conv1d(d, d, k, padding=(k - 1) // 2, groups=d, bias=bias)
        self.norm = nn.BatchNorm1d(d)  # its buffers load from the checkpoint; never updated (training=False)
        self.pointwise_conv2 = nn.Conv1d(d, d, 1, bias=bias)

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        """x [B, T, D], valid [B, T] -> [B, T, D]."""
        h = F.glu(self.pointwise_conv1(x.transpose(1, 2)), dim=1)  # [B, D, T]
        h = self.depthwise_conv(h.masked_fill(valid.logical_not()[:, None, :], 0.0))
        n = self.norm
        h = F.batch_norm(h, n.running_mean, n.running_var, n.weight, n.bias, training=False, eps=n.eps)
        return self.pointwise_conv2(self.act(h)).transpose(1, 2)


class FeedForward(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.act = ACTIVATIONS[cfg.act]
        self.linear1 = Linear(cfg.hidden, cfg.ffn, bias=cfg.attention_bias)
        self.linear2 = Linear(cfg.ffn, cfg.hidden, bias=cfg.attention_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.act(self.linear1(x)))


class ConformerBlock(nn.Module):
    """x + ff1/2, + attention, + conv, + ff2/2, each on its own pre-LayerNorm; then a closing LayerNorm."""

    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.feed_forward1, self.feed_forward2 = FeedForward(cfg), FeedForward(cfg)
        self.self_attn = RelPosAttention(cfg)
        self.conv = ConvModule(cfg)
        for name in ("norm_feed_forward1", "norm_self_att", "norm_conv", "norm_feed_forward2", "norm_out"):
            setattr(self, name, nn.LayerNorm(cfg.hidden))

    def forward(self, x: Tensor, pos: Tensor, mask: Tensor, valid: Tensor) -> Tensor:
        x = x + 0.5 * self.feed_forward1(self.norm_feed_forward1(x))
        x = x + self.self_attn(self.norm_self_att(x), pos, mask)
        x = x + self.conv(self.norm_conv(x), valid)
        x = x + 0.5 * self.feed_forward2(self.norm_feed_forward2(x))
        return self.norm_out(x)


class ParakeetEncoder(nn.Module):
    """Padded mel features [B, T, mel] with each utterance's valid frame count [B] -> [B, T', hidden]."""

    def __init__(self, cfg: AudioEncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.subsampling = Subsampling(cfg)
        self.layers = nn.ModuleList(ConformerBlock(cfg) for _ in range(cfg.layers))

    def forward(self, feats: Tensor, lengths: Tensor) -> Tensor:
        x = self.subsampling(feats, lengths)  # [B, T', D]
        if self.cfg.scale_input:
            x = x * math.sqrt(self.cfg.hidden)
        b, t, d = x.shape
        pos = rel_positions(t, d, x.dtype, x.device)  # [2T'-1, D]
        valid = torch.arange(t, device=x.device) < subsampled_length(lengths, self.cfg)[:, None]  # [B, T']
        mask = (valid[:, None, :] & valid[:, :, None])[:, None]  # [B, 1, T', T']
        for layer in self.layers:
            x = layer(x, pos, mask, valid)
        return x


class OmniAudio(nn.Module):
    """Mel features -> the LM-width rows HF scatters over an utterance's <so_embedding> tokens."""

    def __init__(self, cfg: AudioEncoderConfig, text_hidden: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = ParakeetEncoder(cfg)
        self.projector = audio_projector(cfg, text_hidden)

    def tokens(self, length: int) -> int:
        """Rows kept for an utterance of `length` valid mel frames (its features_mask sum): HF's trim counts one
        frame more than the mask holds, so a last row the encoder treated as padding is kept whenever that adds a
        subsampled frame (length % 8 == 0 at factor 8); it equals the processor's token count for the waveform."""
        return subsampled_length(length + 1, self.cfg)

    def forward(self, features: Tensor, length: int) -> Tensor:
        """One utterance alone: features [F, mel] (F = length + 1 as HF's extractor makes it) -> [n_tokens, D]."""
        return self.forward_batch(features[None], [length])

    def forward_batch(self, features: Tensor, lengths: list[int]) -> Tensor:
        """Clips padded together as HF's processor pads one request's clips: [B, F, mel] with each clip's valid mel
        frames -> [sum n_tokens, D], clips in order (HF's get_audio_features with input_features_mask). The lengths
        are host ints, so trimming needs no device sync."""
        valid = torch.tensor(lengths, device=features.device)  # [B]
        hidden = self.projector(self.encoder(features, valid))  # [B, T', D_text]
        return torch.cat([h[:self.tokens(n)] for h, n in zip(hidden, lengths, strict=True)])


def audio_projector(cfg: AudioEncoderConfig, text_hidden: int) -> OmniProjector:
    """Omni's RMSNorm -> linear_1 -> relu^2 -> linear_2, with biases when audio_config.projection_bias says so."""
    proj = OmniProjector(cfg.hidden, cfg.projection_hidden, text_hidden)
    if cfg.projection_bias:
        proj.linear_1 = Linear(cfg.hidden, cfg.projection_hidden, bias=True)
        proj.linear_2 = Linear(cfg.projection_hidden, text_hidden, bias=True)
    return proj


RELEASED_AUDIO = ((re.compile(r"^sound_encoder\.encoder\."), "audio_tower."),
                  (re.compile(r"^sound_projection\.norm\."), "embed_audio.layer_norm."),
                  (re.compile(r"^sound_projection\.linear1\."), "embed_audio.linear_1."),
                  (re.compile(r"^sound_projection\.linear2\."), "embed_audio.linear_2."))
DROPPED_AUDIO = re.compile(r"^audio_tower\.feature_extractor\.")  # HF's _keys_to_ignore_on_load_unexpected


def omni_audio_name(name: str) -> str | None:
    """A stored audio tensor name (HF's `audio_tower.*` / `embed_audio.*`, or the released checkpoint's
    `sound_encoder.encoder.*` / `sound_projection.*`) -> OmniAudio's parameter or buffer name; None: skipped by name
    (the featurizer buffers). Names outside the audio path come back unchanged, for the caller to route or refuse."""
    name = name.removeprefix("model.")
    for pattern, repl in RELEASED_AUDIO:
        name = pattern.sub(repl, name)
    if DROPPED_AUDIO.match(name):
        return None
    if name.startswith("audio_tower."):
        return "encoder." + name.removeprefix("audio_tower.")
    if name.startswith("embed_audio."):
        return "projector." + name.removeprefix("embed_audio.")
    return name
