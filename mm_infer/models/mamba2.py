"""Mamba-2 mixer (Nemotron-H's): in_proj, causal depthwise conv, the SSD scan (chunked over a prompt, one step at a
time in decode) and the gated RMSNorm, per sequence, with its recurrent state handed in and out."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mm_infer.models.half_linear import Linear


@dataclass(frozen=True)
class Mamba2Dims:
    hidden: int
    heads: int  # H
    head_dim: int  # P
    groups: int  # G (B and C are shared by H / G heads each)
    state: int  # N
    conv_kernel: int  # K
    chunk: int  # the scan's chunk over a prompt
    time_step_min: float  # prefill clamps dt from below (HF's torch path); decode does not
    eps: float
    use_bias: bool = False
    use_conv_bias: bool = True

    @property
    def inner(self) -> int:  # I = H * P
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:  # the channels the conv runs over: x, B and C
        return self.inner + 2 * self.groups * self.state


@dataclass
class MambaState:
    """One sequence's recurrent state in one layer: the conv's last K-1 inputs and the SSM's matrix state."""

    conv: Tensor  # [conv_dim, K-1] in the model dtype
    ssm: Tensor  # [H, P, N] float32

    @staticmethod
    def zeros(d: Mamba2Dims, dtype: torch.dtype, device: torch.device) -> MambaState:
        return MambaState(torch.zeros(d.conv_dim, d.conv_kernel - 1, dtype=dtype, device=device),
                          torch.zeros(d.heads, d.head_dim, d.state, dtype=torch.float32, device=device))


def _segsum(x: Tensor) -> Tensor:
    """x [..., Q] -> [..., Q, Q] with out[i, j] = sum(x[j+1..i]) for i >= j, -inf above the diagonal."""
    q = x.shape[-1]
    cum = torch.cumsum(x, dim=-1)
    out = cum[..., :, None] - cum[..., None, :]
    idx = torch.arange(q, device=x.device)
    return out.masked_fill(idx[None, :] > idx[:, None], float("-inf"))  # above the diagonal


def chunked_scan(x: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, state: Tensor,
                 chunk: int) -> tuple[Tensor, Tensor]:
    """The SSD recurrence S_t = exp(dt_t a) S_{t-1} + dt_t x_t B_t^T, y_t = S_t C_t over one sequence, in chunks
    fixed by its own positions. x [L, H, P], dt [L, H], a [H], b/c [L, H, N] (per head), state [H, P, N]; all
    float32 -> (y [L, H, P] without the D skip, final state [H, P, N])."""
    length = x.shape[0]
    pad = (-length) % chunk
    if pad:  # dt = 0 past the end: the state passes through unchanged
        x, dt, b, c = (F.pad(t, (0, 0) * (t.dim() - 1) + (0, pad)) for t in (x, dt, b, c))
    n = x.shape[0] // chunk
    x, dt, b, c = (t.reshape(n, chunk, *t.shape[1:]) for t in (x, dt, b, c))  # [n, Q, ...]
    adt = (dt * a).permute(0, 2, 1)  # [n, H, Q]
    cum = torch.cumsum(adt, dim=-1)  # [n, H, Q]
    xdt = x * dt[..., None]  # [n, Q, H, P]
    decay = torch.exp(_segsum(adt))  # [n, H, Q, Q]
    scores = torch.einsum("nihs,njhs->nhij", c, b) * decay  # [n, H, Q, Q]
    y = torch.einsum("nhij,njhp->nihp", scores, xdt)  # within each chunk
    to_end = torch.exp(cum[..., -1:] - cum)  # [n, H, Q]
    chunk_states = torch.einsum("njhs,nhj,njhp->nhps", b, to_end, xdt)  # [n, H, P, N] from a zero start
    starts = []
    for i in range(n):  # the chunks' start states, one after another
        starts.append(state)
        state = torch.exp(cum[i, :, -1])[:, None, None] * state + chunk_states[i]
    start = torch.stack(starts)  # [n, H, P, N]
    y = y + torch.einsum("nihs,nhps,nhi->nihp", c, start, torch.exp(cum))
    return y.reshape(n * chunk, *y.shape[2:])[:length], state


def scan_step(x: Tensor, dt: Tensor, a: Tensor, b: Tensor, c: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """One token: x [H, P], dt [H], b/c [H, N], state [H, P, N] -> (y [H, P], state)."""
    state = state * torch.exp(dt * a)[:, None, None] + (dt[:, None] * x)[..., None] * b[:, None, :]
    return torch.einsum("hps,hs->hp", state, c), state


def causal_conv(x: Tensor, state: MambaState, conv: nn.Conv1d) -> Tensor:
    """Depthwise causal conv over one sequence's x [L, C], continuing from the state's last K-1 inputs (which it
    updates) -> [L, C], before any activation (Mamba-2's and the gated DeltaNet's)."""
    window = torch.cat([state.conv, x.t()], dim=1)  # [C, K-1+L]
    out = F.conv1d(window[None], conv.weight, conv.bias, groups=x.shape[1])[0]  # [C, L]
    state.conv = window[:, window.shape[1] - (conv.kernel_size[0] - 1):]  # [C, K-1]
    return out.t()


def conv_step(conv_state: Tensor, x: Tensor, conv: nn.Conv1d) -> tuple[Tensor, Tensor]:
    """One new input x [B, C] of B sequences after their windows [B, C, K-1] -> (the conv's output [B, C] as HF's
    decode computes it, a weighted sum over the window row by row; the new windows [B, C, K-1])."""
    window = torch.cat([conv_state, x[:, :, None]], dim=2)  # [B, C, K]
    out = (window * conv.weight[:, 0]).sum(-1)  # [B, C]
    return (out + conv.bias if conv.bias is not None else out), window[:, :, 1:]


class GatedRMSNorm(nn.Module):
    """y * silu(z), normalised per group of I / G channels in float32, times the weight (HF's gate-then-norm)."""

    def __init__(self, dim: int, groups: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.groups, self.eps = groups, eps

    def forward(self, y: Tensor, z: Tensor) -> Tensor:  # [L, I], [L, I] -> [L, I]
        h = y.float() * F.silu(z.float())
        g = h.view(*h.shape[:-1], self.groups, -1)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * g.view_as(h).to(y.dtype)


class RecurrentMixer(nn.Module):
    """What RecurrentBatch drives in a recurrent layer (Mamba-2 here, the gated DeltaNet too): `in_proj` over the
    whole batch, `mix` per sequence (`step_batch` for decode steps), `out_proj` over the batch."""

    in_proj: nn.Module
    out_proj: nn.Module

    def forward(self, h: Tensor, state: MambaState, decode: bool = False) -> Tensor:
        """One sequence's tokens h [L, hidden] after those the state has seen -> [L, hidden]; the state advances."""
        return self.out_proj(self.mix(self.in_proj(h), state, decode))

    def mix(self, proj: Tensor, state: MambaState, decode: bool = False) -> Tensor:
        raise NotImplementedError

    def step_batch(self, proj: Tensor, conv: Tensor, ssm: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError

    def decode_one(self, proj: Tensor, state: MambaState) -> Tensor:
        """One generated token of one sequence through step_batch; the state advances."""
        assert proj.shape[0] == 1, "a decode step is one token"
        out, conv, ssm = self.step_batch(proj, state.conv[None], state.ssm[None])
        state.conv, state.ssm = conv[0], ssm[0]
        return out


class Mamba2Mixer(RecurrentMixer):
    def __init__(self, d: Mamba2Dims) -> None:
        super().__init__()
        self.d = d
        self.in_proj = Linear(d.hidden, d.inner + d.conv_dim + d.heads, bias=d.use_bias)  # [z | x B C | dt]
        self.conv1d = nn.Conv1d(d.conv_dim, d.conv_dim, d.conv_kernel, groups=d.conv_dim, bias=d.use_conv_bias)
        self.dt_bias = nn.Parameter(torch.ones(d.heads))
        self.A_log = nn.Parameter(torch.zeros(d.heads))
        self.D = nn.Parameter(torch.ones(d.heads))
        self.norm = GatedRMSNorm(d.inner, d.groups, d.eps)
        self.out_proj = Linear(d.inner, d.hidden, bias=d.use_bias)

    def _conv(self, xbc: Tensor, state: MambaState) -> Tensor:
        """Causal depthwise conv + SiLU over xbc [L, C], the state's last K-1 inputs before it; updates them."""
        return F.silu(causal_conv(xbc, state, self.conv1d))

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv window [C, K-1], matrix state [H, P, N]) of one sequence."""
        d = self.d
        return (d.conv_dim, d.conv_kernel - 1), (d.heads, d.head_dim, d.state)

    def mix(self, zxbcdt: Tensor, state: MambaState, decode: bool = False) -> Tensor:
        """in_proj's output for one sequence's tokens [L, I + C + H] -> the gated, normed scan output [L, I] (what
        out_proj takes); the state advances. The projections run over the whole batch (row-invariant GEMMs), this
        per sequence. A decode step (one generated token) takes the recurrence with dt unclamped; prompt tokens,
        however few, the chunked scan with dt clamped, as HF does."""
        d = self.d
        if decode:
            return self.decode_one(zxbcdt, state)
        z, xbc, dt = zxbcdt.split([d.inner, d.conv_dim, d.heads], dim=-1)
        x, b, c = self._conv(xbc, state).split([d.inner, d.groups * d.state, d.groups * d.state], dim=-1)
        a = -torch.exp(self.A_log.float())  # [H]
        dt = F.softplus(dt.float() + self.dt_bias.float())  # [L, H]
        per = d.heads // d.groups
        x32 = x.float().view(-1, d.heads, d.head_dim)  # [L, H, P]
        b, c = (t.float().view(-1, d.groups, d.state).repeat_interleave(per, dim=1) for t in (b, c))  # [L, H, N]
        y, state.ssm = chunked_scan(x32, dt.clamp(min=d.time_step_min), a, b, c, state.ssm, d.chunk)
        y = y + self.D.float()[:, None] * x32  # [L, H, P]
        return self.norm(y.reshape(-1, d.inner).to(zxbcdt.dtype), z)

    def step_batch(self, zxbcdt: Tensor, conv: Tensor, ssm: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One generated token of each of B sequences, HF's decode path: in_proj rows [B, I + C + H], conv windows
        [B, C, K-1], states [B, H, P, N] -> (gated, normed output [B, I], the new windows, the new states). The conv
        is the weighted sum over the window, dt is not clamped; every reduction runs row by row, so a sequence's
        numbers do not depend on the others in the batch."""
        d, n = self.d, zxbcdt.shape[0]
        z, xbc, dt = zxbcdt.split([d.inner, d.conv_dim, d.heads], dim=-1)
        xbc, window = conv_step(conv, xbc, self.conv1d)  # [B, C], [B, C, K-1]
        x, b, c = F.silu(xbc).split([d.inner, d.groups * d.state, d.groups * d.state], dim=-1)
        a = -torch.exp(self.A_log.float())  # [H]
        dt = F.softplus(dt.float() + self.dt_bias.float())  # [B, H]
        x32 = x.float().view(n, d.heads, d.head_dim)  # [B, H, P]
        per = d.heads // d.groups
        b, c = (t.float().view(n, d.groups, d.state).repeat_interleave(per, dim=1) for t in (b, c))  # [B, H, N]
        ssm = ssm * torch.exp(dt * a)[..., None, None] + (dt[..., None] * x32)[..., None] * b[:, :, None, :]
        y = (ssm * c[:, :, None, :]).sum(-1) + self.D.float()[:, None] * x32  # [B, H, P]
        return self.norm(y.reshape(n, d.inner).to(zxbcdt.dtype), z), window, ssm
