"""Gated DeltaNet mixer (Qwen3.5's linear attention): in_proj, causal depthwise conv over q/k/v, the gated delta
rule (chunked over a prompt, one step at a time in decode) and the norm-then-gate RMSNorm, per sequence, with its
recurrent state handed in and out in the Mamba-2 mixer's protocol (MambaState, mix, step_batch)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mm_infer.models.half_linear import Linear
from mm_infer.models.layers import FusedLinear, activation
from mm_infer.models.mamba2 import MambaState, RecurrentMixer, causal_conv

L2_EPS = 1e-6  # inside the rsqrt, as HF's (and FLA's) l2norm


@dataclass(frozen=True)
class GatedDeltaDims:
    hidden: int
    key_heads: int  # nk (q and k heads)
    value_heads: int  # nv (v heads; each key head serves nv / nk consecutive value heads)
    key_dim: int  # dk
    value_dim: int  # dv
    conv_kernel: int  # K
    eps: float  # the gated norm's
    act: str = "silu"  # the conv's activation (HF's hidden_act); the norm's gate is always silu
    chunk: int = 64  # the delta rule's chunk over a prompt (HF's constant, not a config field)

    @property
    def inner(self) -> int:  # nv * dv: the mixed width out_proj takes
        return self.value_heads * self.value_dim

    @property
    def conv_dim(self) -> int:  # the channels the conv runs over: q, k and v
        return 2 * self.key_heads * self.key_dim + self.inner

    @property
    def parts(self) -> tuple[int, int, int, int]:  # in_proj's rows: qkv | z | b | a
        return (self.conv_dim, self.inner, self.value_heads, self.value_heads)


def silu_rows(x: Tensor) -> Tensor:
    """silu as x / (1 + e^-x) in float32, rounded once to x's dtype (as torch's half kernels do). torch's CPU kernels
    finish a run with scalar code whose silu, sigmoid and softplus differ from the vector code's by an ulp, so which
    values take it depends on the batch; exp, log1p, + and / agree in both, so these forms give a row the same bits
    wherever the batch puts it."""
    x32 = x.float()
    return (x32 / (1 + torch.exp(-x32))).to(x.dtype)


def sigmoid_rows(x: Tensor) -> Tensor:
    return (1 / (1 + torch.exp(-x.float()))).to(x.dtype)


def softplus_rows(x: Tensor) -> Tensor:  # torch's threshold: x itself above 20
    return torch.where(x > 20, x, torch.log1p(torch.exp(x)))


def l2norm(x: Tensor) -> Tensor:
    """x [..., d] / sqrt(sum(x²) + eps), HF's formula."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def key_heads_for_values(x: Tensor, value_heads: int) -> Tensor:
    """[..., nk, d] -> [..., nv, d]: value head h reads key head h // (nv / nk) (HF's repeat_interleave)."""
    return x.repeat_interleave(value_heads // x.shape[-2], dim=-2)


def normed_qk(q: Tensor, k: Tensor, decode: bool) -> tuple[Tensor, Tensor]:
    """l2-normalised q and k [..., H, dk] float32, q scaled by dk^-0.5: multiplied in the chunked path, divided by
    sqrt(dk) in the recurrence, as HF writes each (the two differ by an ulp where dk^-0.5 is inexact)."""
    q, k = l2norm(q), l2norm(k)
    dk = q.shape[-1]
    return (q / dk**0.5 if decode else q * dk**-0.5), k


def chunked_gated_delta(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                        chunk: int) -> tuple[Tensor, Tensor]:
    """The gated delta rule S' = e^{g_t} S_{t-1}, S_t = S' + k_t beta_t (v_t - S'^T k_t)^T, o_t = S_t^T q_t over
    one sequence, in chunks of its own positions (HF's UT-transform form). q/k [L, H, dk] (normed, q scaled),
    v [L, H, dv], g/beta [L, H], state [H, dk, dv]; all float32 -> (o [L, H, dv], final state [H, dk, dv])."""
    length, heads = q.shape[:2]
    pad = (-length) % chunk  # k = beta = g = 0 past the end: the state passes through unchanged
    # head-major and contiguous, as HF lays them out: the GEMMs then take HF's kernels and summation order
    q, k, v = (F.pad(t.transpose(0, 1).contiguous(), (0, 0, 0, pad)) for t in (q, k, v))  # [H, Lp, d]
    g, beta = (F.pad(t.t().contiguous(), (0, pad)) for t in (g, beta))  # [H, Lp]
    n = q.shape[1] // chunk
    q, k, v = (t.reshape(heads, n, chunk, -1) for t in (q, k, v))  # [H, n, Q, d]
    g, beta = (t.reshape(heads, n, chunk) for t in (g, beta))  # [H, n, Q]
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]  # [H, n, Q, d]
    cum = g.cumsum(dim=-1)  # [H, n, Q] log decay from the chunk's start
    idx = torch.arange(chunk, device=q.device)
    above = idx[None, :] > idx[:, None]  # [Q, Q] strictly above the diagonal
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(above, float("-inf")).exp()  # [H, n, Q, Q]
    system = (k_beta @ k.transpose(-1, -2)) * decay  # [H, n, Q, Q]; its strict lower part is the UT system
    intra = (q @ k.transpose(-1, -2)) * decay  # [H, n, Q, Q] causal, diagonal included
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)  # [H, n, Q, dv]
    w = torch.linalg.solve_triangular(system, k_beta * cum.exp()[..., None], upper=False,
                                      unitriangular=True)  # [H, n, Q, dk]
    q = q * cum.exp()[..., None]  # [H, n, Q, dk]
    k = k * (cum[..., -1:] - cum).exp()[..., None]  # [H, n, Q, dk] decayed to the chunk's end
    chunk_decay = cum[..., -1].exp()[..., None, None]  # [H, n, 1, 1]
    out = []
    for i in range(n):  # the chunks one after another, each reading the state the previous ones left
        v_new = u[:, i] - w[:, i] @ state  # [H, Q, dv]
        out.append(q[:, i] @ state + intra[:, i] @ v_new)  # [H, Q, dv]
        state = state * chunk_decay[:, i] + k[:, i].transpose(-1, -2) @ v_new  # [H, dk, dv]
    o = torch.stack(out, dim=1).reshape(heads, n * chunk, -1)[:, :length]  # [H, L, dv]
    return o.transpose(0, 1), state


def gated_delta_step(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                     state: Tensor) -> tuple[Tensor, Tensor]:
    """One token of each of B rows: q/k [B, H, dk] (normed, q scaled), v [B, H, dv], g/beta [B, H], state
    [B, H, dk, dv], float32 -> (o [B, H, dv], state). Elementwise products and sums over dk only: no row reads
    another's numbers."""
    state = state * g.exp()[..., None, None]  # [B, H, dk, dv]
    remembered = (state * k[..., None]).sum(dim=-2)  # [B, H, dv] what the state predicts for k
    delta = (v - remembered) * beta[..., None]  # [B, H, dv]
    state = state + k[..., None] * delta[..., None, :]  # [B, H, dk, dv]
    return (state * q[..., None]).sum(dim=-2), state


class NormThenGate(nn.Module):
    """Per head of dv: w * rms-normalised y (normalised in float32, rounded to y's dtype before the plain weight),
    then times silu(z) in float32, rounded once (HF's Qwen3_5RMSNormGated)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.dim, self.eps = dim, eps

    def forward(self, y: Tensor, z: Tensor, silu: Callable[[Tensor], Tensor] = F.silu) -> Tensor:
        """y, z [N, nv*dv] -> [N, nv*dv]; `silu` the gate's (silu_rows in batched decode)."""
        x = y.view(*y.shape[:-1], -1, self.dim).float()  # [N, nv, dv]
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = self.weight * x.to(y.dtype)
        x = x * silu(z.view(x.shape).float())
        return x.to(y.dtype).view(y.shape)


class GatedDeltaNet(RecurrentMixer):
    def __init__(self, d: GatedDeltaDims) -> None:
        super().__init__()
        assert d.value_heads % d.key_heads == 0, "each key head serves a whole number of value heads"
        self.d = d
        self.in_proj = FusedLinear(d.hidden, d.parts, bias=False)  # [qkv | z | b | a]
        self.conv1d = nn.Conv1d(d.conv_dim, d.conv_dim, d.conv_kernel, groups=d.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(d.value_heads))
        self.A_log = nn.Parameter(torch.zeros(d.value_heads))
        self.norm = NormThenGate(d.value_dim, d.eps)
        self.out_proj = Linear(d.inner, d.hidden, bias=False)
        self.act = activation(d.act)
        self.act_rows = silu_rows if d.act == "silu" else self.act  # batched decode's (see silu_rows)

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(conv [conv_dim, K-1] in the model dtype, ssm [nv, dk, dv] float32) of one sequence."""
        d = self.d
        return (d.conv_dim, d.conv_kernel - 1), (d.value_heads, d.key_dim, d.value_dim)

    def mix(self, proj: Tensor, state: MambaState, decode: bool = False) -> Tensor:
        """in_proj's output for one sequence's tokens [L, W] -> the gated, normed output [L, nv*dv] (what out_proj
        takes); the state advances. A decode step (one generated token) takes the recurrence; prompt tokens, however
        few, the chunked rule continuing from state.ssm (HF's prefill path)."""
        d = self.d
        if decode:
            return self.decode_one(proj, state)
        qkv, z, b, a = proj.split(d.parts, dim=-1)
        q, k, v = self._heads(self.act(causal_conv(qkv, state, self.conv1d)))  # [L, nv, dk], [L, nv, dk], [L, nv, dv]
        q, k = normed_qk(q, k, decode=False)
        g = self._decay(a, F.softplus)  # [L, nv]
        beta = b.contiguous().sigmoid().float()  # [L, nv]; contiguous as HF's, so the same vector/scalar split
        o, state.ssm = chunked_gated_delta(q, k, v, g, beta, state.ssm, d.chunk)  # [L, nv, dv]
        return self.norm(o.reshape(-1, d.inner).to(proj.dtype), z)

    def step_batch(self, proj: Tensor, conv: Tensor, ssm: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One generated token of each of B sequences, HF's decode path: in_proj rows [B, W], conv windows
        [B, C, K-1], states [B, nv, dk, dv] -> (gated, normed output [B, nv*dv], the new windows, the new states).
        The conv is the weighted sum over the window (float32 products); every reduction runs row by row and the
        activations take the *_rows forms, so a sequence's numbers do not depend on the others in the batch."""
        d, n = self.d, proj.shape[0]
        qkv, z, b, a = proj.split(d.parts, dim=-1)
        window = torch.cat([conv, qkv[:, :, None]], dim=2)  # [B, C, K]
        qkv = (window.float() * self.conv1d.weight[:, 0].float()).sum(-1).to(proj.dtype)  # [B, C]
        q, k, v = self._heads(self.act_rows(qkv))  # [B, nv, dk], [B, nv, dk], [B, nv, dv]
        q, k = normed_qk(q, k, decode=True)
        g, beta = self._decay(a, softplus_rows), sigmoid_rows(b).float()  # [B, nv] each
        o, ssm = gated_delta_step(q, k, v, g, beta, ssm)  # [B, nv, dv], [B, nv, dk, dv]
        return self.norm(o.reshape(n, d.inner).to(proj.dtype), z, silu_rows), window[:, :, 1:], ssm

    def _heads(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The conv's output [N, C] -> float32 q, k [N, nv, dk] (key heads repeated per value head), v [N, nv, dv]."""
        d = self.d
        q, k, v = qkv.float().split([d.key_heads * d.key_dim, d.key_heads * d.key_dim, d.inner], dim=-1)
        q, k = (key_heads_for_values(t.unflatten(-1, (d.key_heads, d.key_dim)), d.value_heads) for t in (q, k))
        return q, k, v.unflatten(-1, (d.value_heads, d.value_dim))

    def _decay(self, a: Tensor, softplus: Callable[[Tensor], Tensor]) -> Tensor:
        """a [N, nv] -> the float32 log decay g = -e^{A_log} softplus(a + dt_bias) [N, nv], unclamped."""
        return -self.A_log.float().exp() * softplus(a.float() + self.dt_bias.float())
