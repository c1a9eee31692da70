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
    snapshots: tuple[tuple[int, int], ...] = ()  # (absolute position, slot): the state there is also kept
    boundaries: tuple[int, ...] = ()  # the prompt's state boundaries: its scan restarts there in every run

    def pieces(self) -> list[tuple[int, int, bool, int | None]]:
        """(lo, hi, decode, snapshot slot after it or None) offsets of the runs the mixer takes one at a time: prompt
        tokens in chunked scans split at the prompt's state boundaries; generated tokens one by one."""
        end = self.start + self.length
        cuts = {self.start, end, min(max(self.prompt_len, self.start), end)}
        cuts |= {at for at in (*self.boundaries, *(p for p, _ in self.snapshots)) if self.start < at < end}
        ordered = sorted(cuts)
        kept = dict(self.snapshots)
        out: list[tuple[int, int, bool, int | None]] = []
        for lo, hi in zip(ordered, ordered[1:], strict=False):
            if lo >= self.prompt_len:
                out += [(p - self.start, p + 1 - self.start, True, kept.get(p + 1)) for p in range(lo, hi)]
            else:
                out.append((lo - self.start, hi - self.start, False, kept.get(hi)))
        return out

    def snapshot_offsets(self) -> list[int]:
        """Tokens into the segment after which each snapshot is taken (the kernels' form)."""
        return [pos - self.start for pos, _ in self.snapshots]


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
                if snap is not None:
                    self.staged.append((layer, snap, MambaState(state.conv.clone(), state.ssm.clone())))
            self.staged.append((layer, seg.write, state))
        return mixer.out_proj(mixed)

    def _kernel_segments(self, device: torch.device) -> K.Segments:
        """The segments as the kernels' device metadata (built once per step)."""
        if self._device_segments is None:
            rows = [(s.row, s.length, s.start, s.prompt_len, -1 if s.read is None else s.read) for s in self.segments]
            self._device_segments = K.Segments.build(rows, [s.snapshot_offsets() for s in self.segments], device)
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
        self.staged_kernel.append((layer, conv_end, ssm_end, conv_snap, ssm_snap, seg.snaps))
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
        self.staged_kernel.append((layer, conv_end, ssm_end, conv_snap, ssm_snap, seg.snaps))
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
            per = max([len(s.snapshots) for s in self.segments] + [1])  # snapshot rows per segment in the kernels
            kept = [(k * per + m, slot) for k, s in enumerate(self.segments) for m, (_, slot) in enumerate(s.snapshots)]
            kept_rows = torch.tensor([r for r, _ in kept], dtype=torch.long, device=device)
            kept_slots = torch.tensor([slot for _, slot in kept], dtype=torch.long, device=device)
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
