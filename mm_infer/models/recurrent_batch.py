"""Per-sequence recurrent state for hybrid LMs: a pool of state slots (conv and matrix state per Mamba layer) and
the step's view of it, which reads each sequence's slot, stages the advanced states and writes them back only when
the whole forward has succeeded (a failed or rerun step never advances a state twice)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

import mm_infer_kernels.dispatch as K
from mm_infer.models.mamba2 import Mamba2Mixer, MambaState


@dataclass(frozen=True)
class StateSegment:
    """One sequence's tokens in the batch: rows [row, row+length), absolute positions [start, start+length)."""

    row: int
    start: int
    length: int
    prompt_len: int  # positions >= prompt_len were generated: each takes the decode recurrence, as HF's decode does
    read: int | None  # slot to continue from; None: a fresh sequence (zero state)
    write: int  # slot the advanced state goes to
    snapshot: tuple[int, int] | None = None  # (absolute position, slot): the state there is also kept
    boundary: int = 0  # the prompt's snapshot position: its scan restarts there in every run, cold or hit

    def pieces(self) -> list[tuple[int, int, bool, bool]]:
        """(lo, hi, decode, snapshot after) offsets of the runs the mixer takes one at a time: prompt tokens in one
        chunked scan, split at the prompt's snapshot boundary; generated tokens one by one."""
        end = self.start + self.length
        cuts = {self.start, end, min(max(self.prompt_len, self.start), end)}
        cuts |= {at for at in (self.boundary, self.snapshot[0] if self.snapshot else 0) if self.start < at < end}
        cuts_sorted = sorted(cuts)
        out = []
        for lo, hi in zip(cuts_sorted, cuts_sorted[1:], strict=False):
            if lo >= self.prompt_len:
                out += [(p - self.start, p + 1 - self.start, True, False) for p in range(lo, hi)]
            else:
                out.append((lo - self.start, hi - self.start, False, False))
        if self.snapshot is not None:
            at = self.snapshot[0]
            out = [(lo, hi, dec, snap or hi + self.start == at) for lo, hi, dec, snap in out]
        return out


StateShapes = dict[int, tuple[tuple[int, ...], tuple[int, ...]]]  # layer -> (conv window, matrix state) shapes


class StatePool:
    """Slots of recurrent state for the recurrent layers (Mamba-2, gated DeltaNet): a conv window per layer in the
    model dtype, e.g. [S, C, K-1], and a matrix state in float32, e.g. [S, H, P, N] or [S, Hv, Dk, Dv]."""

    def __init__(self, shapes: StateShapes, slots: int, dtype: torch.dtype, device: torch.device) -> None:
        self.slots, self.shapes = slots, dict(shapes)
        self.conv = {i: torch.zeros(slots, *conv, dtype=dtype, device=device) for i, (conv, _) in shapes.items()}
        self.ssm = {i: torch.zeros(slots, *ssm, dtype=torch.float32, device=device) for i, (_, ssm) in shapes.items()}

    @staticmethod
    def bytes_per_slot(shapes: StateShapes, dtype: torch.dtype) -> int:
        return sum(math.prod(conv) * dtype.itemsize + math.prod(ssm) * 4 for conv, ssm in shapes.values())

    def read(self, layer: int, slot: int | None) -> MambaState:
        """A copy of one slot's state (zeros for None): the forward advances it without touching the pool."""
        if slot is None:
            conv, ssm = self.conv[layer][0], self.ssm[layer][0]
            return MambaState(torch.zeros_like(conv), torch.zeros_like(ssm))
        return MambaState(self.conv[layer][slot].clone(), self.ssm[layer][slot].clone())

    def copy_slot(self, src: int, dst: int) -> None:
        for layer in self.conv:
            self.conv[layer][dst] = self.conv[layer][src]
            self.ssm[layer][dst] = self.ssm[layer][src]

    def release(self) -> None:
        """Free the pool's memory (sleep); `restore` brings back zeroed slots of the same shapes."""
        for d in (self.conv, self.ssm):
            for layer, t in d.items():
                d[layer] = torch.empty((0, *t.shape[1:]), dtype=t.dtype, device=t.device)

    def restore(self) -> None:
        for d in (self.conv, self.ssm):
            for layer, t in d.items():
                d[layer] = torch.zeros((self.slots, *t.shape[1:]), dtype=t.dtype, device=t.device)


@dataclass
class RecurrentBatch:
    """The step's segments over a pool; `commit` writes the staged states once the forward has succeeded."""

    pool: StatePool
    segments: list[StateSegment]
    invariant: bool = False  # batch-invariant mode: every segment's conv and scan run alone
    staged: list[tuple[int, int, MambaState]] = field(default_factory=list)  # (layer, slot, state)
    staged_kernel: list[tuple[int, Tensor, Tensor, Tensor, Tensor, Tensor]] = field(default_factory=list)
    staged_steps: list[tuple[int, list[int], Tensor, Tensor]] = field(default_factory=list)  # batched decode
    _device_segments: K.Segments | None = None

    def run_layer(self, layer: int, mixer: torch.nn.Module, h: Tensor) -> Tensor:
        """Mixer output [N, D] for the normed input h [N, D]: the projections over the whole batch, the conv and
        scan for each segment from its slot (one launch each on the Triton path; piece by piece in torch, the
        chunked scan HF runs); rows outside every segment (padding) mix nothing."""
        zxbcdt = mixer.in_proj(h)  # [N, I + C + H]
        if K.select_backend(h, self.pool.ssm[layer]) == "triton":
            kernels = self._mix_kernels if isinstance(mixer, Mamba2Mixer) else self._mix_kernels_delta
            return mixer.out_proj(kernels(layer, mixer, zxbcdt))
        mixed = h.new_zeros(h.shape[0], mixer.d.inner)  # [N, I]
        # decode steps all at once; under batch invariance one by one (a row's reductions would see the batch size)
        steps = [] if self.invariant else [s for s in self.segments if s.length == 1 and s.start >= s.prompt_len]
        if steps:
            rows, reads = [s.row for s in steps], [s.read for s in steps]
            assert None not in reads, "a decode step continues a state"
            mixed[rows], conv, ssm = mixer.step_batch(zxbcdt[rows], self.pool.conv[layer][reads],
                                                      self.pool.ssm[layer][reads])
            self.staged_steps.append((layer, [s.write for s in steps], conv, ssm))
        for seg in self.segments:
            if steps and seg.length == 1 and seg.start >= seg.prompt_len:
                continue
            state = self.pool.read(layer, seg.read)
            for lo, hi, decode, snap in seg.pieces():
                rows = slice(seg.row + lo, seg.row + hi)
                mixed[rows] = mixer.mix(zxbcdt[rows], state, decode)
                if snap:
                    assert seg.snapshot is not None
                    self.staged.append((layer, seg.snapshot[1], MambaState(state.conv.clone(), state.ssm.clone())))
            self.staged.append((layer, seg.write, state))
        return mixer.out_proj(mixed)

    def _kernel_segments(self, device: torch.device) -> K.Segments:
        """The segments as the kernels' device metadata (built once per step)."""
        if self._device_segments is None:
            rows = [(s.row, s.length, s.start, s.prompt_len, -1 if s.read is None else s.read,
                     s.snapshot[0] - s.start if s.snapshot is not None and s.start < s.snapshot[0] <= s.start
                     + s.length else 0) for s in self.segments]
            self._device_segments = K.Segments.build(rows, device)
        return self._device_segments

    def _mix_kernels(self, layer: int, mixer: torch.nn.Module, zxbcdt: Tensor) -> Tensor:
        """mixer.mix for every segment at once: the conv and the scan kernels over the pool; the final and snapshot
        states are staged -> [N, I]."""
        d, seg = mixer.d, self._kernel_segments(zxbcdt.device)
        z, xbc, dt = zxbcdt.split([d.inner, d.conv_dim, d.heads], dim=-1)
        bias = mixer.conv1d.bias
        conv, conv_end, conv_snap = K.mamba_conv(xbc, mixer.conv1d.weight[:, 0].contiguous(), bias,
                                                 self.pool.conv[layer], seg)
        x, b, c = conv.split([d.inner, d.groups * d.state, d.groups * d.state], dim=-1)
        n = zxbcdt.shape[0]
        y, ssm_end, ssm_snap = K.mamba_scan(x.reshape(n, d.heads, d.head_dim), dt, mixer.dt_bias, mixer.A_log,
                                            b.reshape(n, d.groups, d.state), c.reshape(n, d.groups, d.state),
                                            mixer.D, self.pool.ssm[layer], seg, d.time_step_min)
        self.staged_kernel.append((layer, conv_end, ssm_end, conv_snap, ssm_snap, seg.snap))
        return mixer.norm(y.reshape(n, d.inner).to(zxbcdt.dtype), z)

    def _mix_kernels_delta(self, layer: int, mixer: torch.nn.Module, proj: Tensor) -> Tensor:
        """mixer.mix for every segment of a gated DeltaNet layer at once: the conv kernel (no bias, SiLU) and the
        gated delta kernel over the pool (the recurrence token by token, prompt and decode alike) -> [N, nv*dv]."""
        from mm_infer.models.gated_delta import normed_qk

        d, seg = mixer.d, self._kernel_segments(proj.device)
        assert d.act == "silu", "the conv kernel applies SiLU"
        qkv, z, b, a = proj.split(d.parts, dim=-1)
        conv, conv_end, conv_snap = K.mamba_conv(qkv, mixer.conv1d.weight[:, 0].contiguous(), None,
                                                 self.pool.conv[layer], seg)
        q, k, v = mixer._heads(conv)  # [N, nv, dk], [N, nv, dk], [N, nv, dv]
        q, k = normed_qk(q, k, decode=False)
        g, beta = mixer._decay(a, torch.nn.functional.softplus), b.float().sigmoid()  # [N, nv] each
        o, ssm_end, ssm_snap = K.gated_delta(q, k, v, g, beta, self.pool.ssm[layer], seg)
        self.staged_kernel.append((layer, conv_end, ssm_end, conv_snap, ssm_snap, seg.snap))
        return mixer.norm(o.reshape(proj.shape[0], d.inner).to(proj.dtype), z)

    def commit(self) -> None:
        for layer, slot, state in self.staged:
            self.pool.conv[layer][slot] = state.conv
            self.pool.ssm[layer][slot] = state.ssm
        self.staged.clear()
        for layer, slots, conv, ssm in self.staged_steps:
            self.pool.conv[layer][slots] = conv
            self.pool.ssm[layer][slots] = ssm
        self.staged_steps.clear()
        if self.staged_kernel:
            device = self.staged_kernel[0][1].device
            writes = torch.tensor([s.write for s in self.segments], device=device)
            kept = [k for k, s in enumerate(self.segments) if s.snapshot is not None and s.start < s.snapshot[0]
                    <= s.start + s.length]
            kept_rows = torch.tensor(kept, dtype=torch.long, device=device)
            kept_slots = torch.tensor([self.segments[k].snapshot[1] for k in kept], device=device)  # type: ignore
            for layer, conv_end, ssm_end, conv_snap, ssm_snap, _ in self.staged_kernel:
                self.pool.conv[layer][writes] = conv_end
                self.pool.ssm[layer][writes] = ssm_end
                if kept:
                    self.pool.conv[layer][kept_slots] = conv_snap[kept_rows]
                    self.pool.ssm[layer][kept_slots] = ssm_snap[kept_rows]
            self.staged_kernel.clear()


def fresh_batch(pool: StatePool, seq_lens: Sequence[int]) -> RecurrentBatch:
    """Whole sequences from a zero state, one slot each (tests, HF parity, the memory profile)."""
    segments, row = [], 0
    for k, n in enumerate(seq_lens):
        segments.append(StateSegment(row, 0, n, n, None, k))
        row += n
    return RecurrentBatch(pool, segments)
