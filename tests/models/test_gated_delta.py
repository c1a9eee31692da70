"""Our Gated DeltaNet mixer against HF's Qwen3_5GatedDeltaNet (float32, torch reference path): whole prompts, chunked
prefill then decode from our handed-out state, batched decode vs one by one, and ablations the tests must catch.

The mixer tests feed `mix` HF's own four projections: our fused in_proj computes the narrow b and a parts with another
GEMM kernel, an ulp away, and the decay and the per-head norm amplify that to ~1e-5 on outputs of ~5; the whole-forward
test states that bound relative to the output's scale."""

from __future__ import annotations

import os

import pytest
import torch
from torch import Tensor, nn

from mm_infer.models import gated_delta as gd
from mm_infer.models.gated_delta import GatedDeltaDims, GatedDeltaNet
from mm_infer.models.mamba2 import MambaState

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TOL = 1e-5
DIMS = GatedDeltaDims(hidden=64, key_heads=2, value_heads=4, key_dim=16, value_dim=16, conv_kernel=4, eps=1e-6)


def _hf_layer() -> nn.Module:
    """HF's layer from a tiny text config, every parameter random (HF inits some to constants)."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    cfg = Qwen3_5TextConfig(hidden_size=DIMS.hidden, num_hidden_layers=1, layer_types=["linear_attention"],
                            linear_num_key_heads=DIMS.key_heads, linear_num_value_heads=DIMS.value_heads,
                            linear_key_head_dim=DIMS.key_dim, linear_value_head_dim=DIMS.value_dim,
                            linear_conv_kernel_dim=DIMS.conv_kernel, rms_norm_eps=DIMS.eps, hidden_act="silu")
    torch.manual_seed(0)
    layer = Qwen3_5GatedDeltaNet(cfg, layer_idx=0).float().eval()
    with torch.no_grad():
        for name, p in layer.named_parameters():  # linears at 1/sqrt(fan-in): outputs of order 1, as in a model
            p.copy_(torch.randn_like(p) * (p.shape[-1] ** -0.5 if p.dim() == 2 else 0.5))
            if name == "norm.weight":
                p.add_(1.0)
    return layer


def _ours_from(hf: nn.Module) -> GatedDeltaNet:
    """Our layer with HF's weights; in_proj part i from in_proj_qkv / z / b / a."""
    ours = GatedDeltaNet(DIMS).float().eval()
    with torch.no_grad():
        for i, name in enumerate(("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")):
            row, rows = ours.in_proj.part_rows(i)
            ours.in_proj.weight[row:row + rows] = getattr(hf, name).weight
        for name in ("conv1d.weight", "dt_bias", "A_log", "norm.weight", "out_proj.weight"):
            ours.get_parameter(name).copy_(hf.get_parameter(name))
    return ours


@pytest.fixture(scope="module")
def pair() -> tuple[nn.Module, GatedDeltaNet]:
    hf = _hf_layer()
    return hf, _ours_from(hf)


def _zero_state(net: GatedDeltaNet, dtype: torch.dtype = torch.float32) -> MambaState:
    conv, ssm = net.state_shapes()
    return MambaState(torch.zeros(conv, dtype=dtype), torch.zeros(ssm, dtype=torch.float32))


def _tokens(length: int, seed: int = 1) -> Tensor:
    return torch.randn(length, DIMS.hidden, generator=torch.Generator().manual_seed(seed))  # [L, hidden]


@torch.no_grad()
def _hf(hf: nn.Module, h: Tensor) -> Tensor:
    return hf(h[None])[0]  # [L, hidden], no cache: the chunked rule over the whole sequence


def _hf_proj(hf: nn.Module, h: Tensor) -> Tensor:
    """HF's in_proj_qkv | z | b | a outputs for h [L, hidden] -> [L, W], our in_proj's layout."""
    return torch.cat([getattr(hf, f"in_proj_{p}")(h) for p in ("qkv", "z", "b", "a")], dim=-1)


def _mixed(hf: nn.Module, ours: GatedDeltaNet, h: Tensor, state: MambaState, decode: bool = False) -> Tensor:
    return ours.out_proj(ours.mix(_hf_proj(hf, h), state, decode))  # [L, hidden]


@torch.no_grad()
def _prompt_diff(hf: nn.Module, ours: GatedDeltaNet, length: int) -> float:
    h = _tokens(length)
    return (_mixed(hf, ours, h, _zero_state(ours)) - _hf(hf, h)).abs().max().item()


@pytest.mark.parametrize("length", [1, 7, 64, 150])
def test_prompt_matches_hf(pair, length: int) -> None:
    """Catches: wrong splits of in_proj, conv window, head mapping, decay/beta, the chunk rule or its padding, norm."""
    diff = _prompt_diff(*pair, length)
    assert diff <= TOL, diff


@torch.no_grad()
def test_forward_matches_hf(pair) -> None:
    """Catches: in_proj parts in the wrong rows, or forward not composing in_proj, mix and out_proj."""
    hf, ours = pair
    h = _tokens(150)
    ref = _hf(hf, h)
    diff = (ours(h, _zero_state(ours)) - ref).abs().max().item()
    assert diff <= TOL * ref.abs().max().item(), diff


@torch.no_grad()
def test_chunked_prefill_then_decode_matches_hf(pair) -> None:
    """Catches: a conv window or matrix state not carried between calls (prefill 70 + 80, then 5 decode steps), and
    a recurrence that differs from the chunked rule."""
    hf, ours = pair
    h = _tokens(155, seed=2)
    state = _zero_state(ours)
    outs = [_mixed(hf, ours, h[:70], state), _mixed(hf, ours, h[70:150], state)]
    outs += [_mixed(hf, ours, h[i:i + 1], state, decode=True) for i in range(150, 155)]
    diff = (torch.cat(outs) - _hf(hf, h)).abs().max().item()
    assert diff <= TOL, diff


@torch.no_grad()
def test_state_shapes_and_dtypes(pair) -> None:
    """Catches: a state that changes shape or leaves float32 across prefill and decode (the engine pools it)."""
    _, ours = pair
    state = _zero_state(ours)
    ours(_tokens(2), state)  # fewer tokens than K-1: the window still keeps K-1 columns
    ours(_tokens(1, seed=3), state, decode=True)
    assert (tuple(state.conv.shape), tuple(state.ssm.shape)) == ours.state_shapes()
    assert state.ssm.dtype == torch.float32


def _random_net(d: GatedDeltaDims, seed: int) -> GatedDeltaNet:
    torch.manual_seed(seed)
    net = GatedDeltaNet(d).float().eval()
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return net


@pytest.mark.parametrize("d", [DIMS, GatedDeltaDims(hidden=128, key_heads=2, value_heads=6, key_dim=128,
                                                    value_dim=128, conv_kernel=4, eps=1e-6)], ids=["tiny", "dk128"])
@torch.no_grad()
def test_step_batch_is_row_invariant(d: GatedDeltaDims) -> None:
    """Catches: a batched decode whose rows read each other's numbers (B sequences at once vs one by one, bit for
    bit; dk128 exercises torch's vector loops and their scalar tails at a real head size)."""
    net, n = _random_net(d, seed=4), 13  # 13 rows: B * nv fills no whole vector block, its tail runs scalar code
    conv, ssm = net.state_shapes()
    states = [MambaState(torch.randn(conv), 0.1 * torch.randn(ssm)) for _ in range(n)]  # distinct histories
    proj = net.in_proj(torch.randn(n, d.hidden))  # [B, W]
    out, conv, ssm = net.step_batch(proj, torch.stack([s.conv for s in states]), torch.stack([s.ssm for s in states]))
    for k, s in enumerate(states):
        one = net.mix(proj[k:k + 1], s, decode=True)
        assert torch.equal(out[k:k + 1], one) and torch.equal(conv[k], s.conv) and torch.equal(ssm[k], s.ssm), k


class _GateThenNorm(gd.NormThenGate):
    """The Mamba-2 order (gate, then norm): the wrong one for Qwen3.5."""

    def forward(self, y: Tensor, z: Tensor) -> Tensor:
        x = (y.float() * torch.nn.functional.silu(z.float())).view(*y.shape[:-1], -1, self.dim)
        return (self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).view(y.shape)


def _unscaled_qk(q: Tensor, k: Tensor, decode: bool) -> tuple[Tensor, Tensor]:
    return gd.l2norm(q), gd.l2norm(k)


def _modulo_heads(x: Tensor, value_heads: int) -> Tensor:  # value head h reads key head h % nk
    return x.repeat(*([1] * (x.dim() - 2)), value_heads // x.shape[-2], 1)


@pytest.mark.parametrize("ablation", ["gate_then_norm", "q_unscaled", "heads_modulo"])
def test_ablations_are_caught(pair, monkeypatch, ablation: str) -> None:
    """Each plausible bug must move the output far past the tolerance, so the parity tests above can fail."""
    hf, ours = pair[0], _ours_from(pair[0])  # a copy of ours to break
    if ablation == "gate_then_norm":
        wrong = _GateThenNorm(DIMS.value_dim, DIMS.eps)
        wrong.weight = ours.norm.weight
        ours.norm = wrong
    elif ablation == "q_unscaled":
        monkeypatch.setattr(gd, "normed_qk", _unscaled_qk)
    else:
        monkeypatch.setattr(gd, "key_heads_for_values", _modulo_heads)
    diff = _prompt_diff(hf, ours, 70)
    assert diff > 100 * TOL, diff
