"""@triton.jit kernels of mamba_segments.py (imported by its launchers through mm_infer_kernels._triton.load)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _conv_input(x_ptr, state_ptr, row0, pos, c, cmask, x_n, st_c, has_state, K: tl.constexpr):
    """The segment's conv inputs at positions pos [T] (pos < 0: the state's last K-1 inputs, zeros without a
    state) -> [T, C] float32."""
    inside = pos >= 0
    xv = tl.load(x_ptr + (row0 + pos)[:, None] * x_n + c[None, :], mask=inside[:, None] & cmask[None, :],
                 other=0.0).to(tl.float32)
    before = (pos < 0) & (pos >= -(K - 1)) & (tl.zeros_like(pos) + has_state.to(tl.int32) > 0)
    sv = tl.load(state_ptr + c[None, :] * st_c + (K - 1 + pos)[:, None], mask=before[:, None] & cmask[None, :],
                 other=0.0)
    return tl.where(inside[:, None], xv, sv.to(tl.float32))


@triton.jit
def mamba_conv_kernel(x_ptr, w_ptr, b_ptr, pool_ptr, out_ptr, state_out_ptr, snap_out_ptr,
                      starts_ptr, lens_ptr, read_ptr, snap_ptr, x_n, o_n, pool_s, pool_c, so_s, so_c, C,
                      K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
                      SNAPS: tl.constexpr):
    """One program per (segment, channel block): causal depthwise conv + SiLU over the segment's rows of x [N, C],
    its window starting from the pool slot read_ptr[s] (-1: zeros); the last K-1 inputs go to state_out [S, C, K-1]
    and, at snap_ptr[s, m] > 0 tokens into the segment, to snap_out row s * SNAPS + m."""
    s = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = c < C
    row0 = tl.load(starts_ptr + s)
    length = tl.load(lens_ptr + s)
    slot = tl.load(read_ptr + s)
    state_ptr = pool_ptr + tl.maximum(slot, 0).to(tl.int64) * pool_s
    bias = tl.load(b_ptr + c, mask=cmask, other=0.0).to(tl.float32) if HAS_BIAS else tl.zeros([BLOCK_C], tl.float32)
    t = tl.arange(0, BLOCK_T)
    for t0 in range(0, length, BLOCK_T):
        pos = t0 + t
        acc = tl.zeros([BLOCK_T, BLOCK_C], tl.float32) + bias[None, :]
        for k in tl.static_range(K):
            w = tl.load(w_ptr + c * K + k, mask=cmask, other=0.0).to(tl.float32)
            xv = _conv_input(x_ptr, state_ptr, row0, pos - (K - 1) + k, c, cmask, x_n, pool_c, slot >= 0, K)
            acc += xv * w[None, :]
        out = acc / (1.0 + tl.exp(-acc))  # SiLU
        tl.store(out_ptr + (row0 + pos)[:, None] * o_n + c[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=(pos < length)[:, None] & cmask[None, :])
    for i in tl.static_range(K - 1):
        p = tl.full([1], 0, tl.int32) + length - (K - 1) + i
        last = _conv_input(x_ptr, state_ptr, row0, p, c, cmask, x_n, pool_c, slot >= 0, K)
        tl.store(state_out_ptr + s * so_s + c[None, :] * so_c + i, last.to(state_out_ptr.dtype.element_ty),
                 mask=cmask[None, :])
        for m in tl.static_range(SNAPS):
            snap = tl.load(snap_ptr + s * SNAPS + m)
            if snap > 0:
                q = tl.full([1], 0, tl.int32) + snap - (K - 1) + i
                kept = _conv_input(x_ptr, state_ptr, row0, q, c, cmask, x_n, pool_c, slot >= 0, K)
                tl.store(snap_out_ptr + (s * SNAPS + m) * so_s + c[None, :] * so_c + i,
                         kept.to(snap_out_ptr.dtype.element_ty), mask=cmask[None, :])


@triton.jit
def mamba_scan_kernel(x_ptr, dt_ptr, dt_bias_ptr, a_log_ptr, b_ptr, c_ptr, d_ptr, pool_ptr, y_ptr, state_out_ptr,
                      snap_out_ptr, starts_ptr, lens_ptr, pos0_ptr, prompt_ptr, read_ptr, snap_ptr, dt_min,
                      H, P, NS, PER,
                      BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, SNAPS: tl.constexpr):
    """One program per (segment, head, P block): the SSD recurrence S = exp(dt a) S + dt x B^T, y = S C + D x over
    the segment's tokens in order, fp32. x/y [N, H, P], dt [N, H] (before softplus and bias), B/C [N, G, NS] (head h
    reads group h // PER); dt clamped from below at dt_min for prompt tokens (positions < prompt_ptr[s]) only, as
    HF's prefill and decode paths do. The state starts from pool slot read_ptr[s] (-1: zeros) and ends in
    state_out [S, H, P, NS]; at snap_ptr[s, m] > 0 tokens into the segment it also goes to snap_out row s*SNAPS+m."""
    s = tl.program_id(0)
    h = tl.program_id(1)
    p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_N)
    pmask, nmask = p < P, n < NS
    smask = pmask[:, None] & nmask[None, :]
    row0 = tl.load(starts_ptr + s)
    length = tl.load(lens_ptr + s)
    pos0 = tl.load(pos0_ptr + s)
    prompt = tl.load(prompt_ptr + s)
    slot = tl.load(read_ptr + s)
    st_off = h * P * NS + p[:, None] * NS + n[None, :]
    has_state = tl.zeros([BLOCK_P, BLOCK_N], tl.int32) + (slot >= 0).to(tl.int32) > 0  # the interpreter's masks
    state = tl.load(pool_ptr + tl.maximum(slot, 0).to(tl.int64) * H * P * NS + st_off, mask=smask & has_state,
                    other=0.0)
    a = -tl.exp(tl.load(a_log_ptr + h).to(tl.float32))
    bias = tl.load(dt_bias_ptr + h).to(tl.float32)
    dskip = tl.load(d_ptr + h).to(tl.float32)
    g = h // PER
    gsize = (H // PER) * NS
    for t in range(0, length):
        row = row0 + t
        raw = tl.load(dt_ptr + row * H + h).to(tl.float32) + bias
        dt = tl.where(raw > 20.0, raw, tl.log(1.0 + tl.exp(raw)))  # softplus (torch's threshold 20)
        dt = tl.where(pos0 + t < prompt, tl.maximum(dt, dt_min), dt)
        x = tl.load(x_ptr + row * H * P + h * P + p, mask=pmask, other=0.0).to(tl.float32)  # [P]
        bv = tl.load(b_ptr + row * gsize + g * NS + n, mask=nmask, other=0.0).to(tl.float32)  # [NS]
        cv = tl.load(c_ptr + row * gsize + g * NS + n, mask=nmask, other=0.0).to(tl.float32)
        state = state * tl.exp(dt * a) + (dt * x)[:, None] * bv[None, :]
        y = tl.sum(state * cv[None, :], axis=1) + dskip * x
        tl.store(y_ptr + row * H * P + h * P + p, y, mask=pmask)
        for m in tl.static_range(SNAPS):
            if t + 1 == tl.load(snap_ptr + s * SNAPS + m):
                tl.store(snap_out_ptr + (s * SNAPS + m) * H * P * NS + st_off, state, mask=smask)
    tl.store(state_out_ptr + s * H * P * NS + st_off, state, mask=smask)
