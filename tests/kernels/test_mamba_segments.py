"""The Mamba-2 segment kernels (conv + SiLU, the SSD scan) against their torch references, and the references against
the model's own chunked path: fresh and continued segments, snapshots, decode tokens unclamped, padding rows."""

from __future__ import annotations

import pytest
import torch

from mm_infer_kernels import mamba_segments as ms

# (start row, length, first position, prompt length, read slot or -1) and the snapshot offsets: a fresh prompt with
# two snapshots, a continued chunk, two decode steps, a prompt whose last tokens were generated (recompute), padding
SEGMENTS = [(0, 11, 0, 11, -1), (11, 6, 8, 20, 1), (17, 1, 30, 25, 0), (18, 1, 12, 12, 2), (19, 5, 0, 3, -1)]
SNAPS = [[4, 8], [], [], [], [3]]
ROWS = 26  # two padding rows


def _inputs(device, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    c_dim, k, h, p, groups, ns = 40, 4, 4, 8, 2, 16
    r = lambda *s, scale=1.0: (scale * torch.randn(*s, generator=g)).to(device)  # noqa: E731
    return dict(x=r(ROWS, c_dim).to(dtype), weight=r(c_dim, k, scale=0.5), bias=r(c_dim, scale=0.1),
                conv_pool=r(3, c_dim, k - 1).to(dtype), xs=r(ROWS, h, p), dt=r(ROWS, h) - 2.0,
                dt_bias=r(h, scale=0.5), a_log=torch.rand(h, generator=g).to(device), b=r(ROWS, groups, ns),
                c=r(ROWS, groups, ns), d=r(h), ssm_pool=r(3, h, p, ns, scale=0.3))


def test_conv_triton_equals_reference(device):
    # catches: a window reading the wrong slot or the next segment's rows, the state's order reversed, the
    # snapshot of the wrong offset
    v = _inputs(device)
    seg = ms.Segments.build(SEGMENTS, SNAPS, device)
    want = ms.conv_reference(v["x"], v["weight"], v["bias"], v["conv_pool"], seg)
    got = ms.conv_triton(v["x"], v["weight"], v["bias"], v["conv_pool"], seg)
    for a, b in zip(got, want, strict=True):
        assert (a - b).abs().max().item() <= 1e-5
    assert got[0][24:].abs().max() == 0  # padding rows untouched


def test_scan_triton_equals_reference(device):
    # catches: dt clamped for generated tokens (or not for prompt ones), a head reading another group's B/C,
    # a state started from zero instead of its slot, the snapshot after the wrong token
    v = _inputs(device)
    seg = ms.Segments.build(SEGMENTS, SNAPS, device)
    args = (v["xs"], v["dt"], v["dt_bias"], v["a_log"], v["b"], v["c"], v["d"], v["ssm_pool"], seg, 0.05)
    want = ms.scan_reference(*args)
    got = ms.scan_triton(*args)
    for a, b in zip(got, want, strict=True):
        assert (a - b).abs().max().item() <= 1e-5


@pytest.mark.parametrize("clamped", [True, False])
def test_scan_reference_equals_the_models_chunked_scan_and_step(clamped):
    # the reference is the model's math: the chunked scan (prompt, clamped) or the decode step (unclamped)
    from mm_infer.models.mamba2 import chunked_scan, scan_step

    v = _inputs(torch.device("cpu"))
    length = 11
    seg = ms.Segments.build([(0, length, 0, length if clamped else 0, -1)], [[]], torch.device("cpu"))
    y, final, _ = ms.scan_reference(v["xs"], v["dt"], v["dt_bias"], v["a_log"], v["b"], v["c"], v["d"],
                                    v["ssm_pool"], seg, 0.05)
    a = -torch.exp(v["a_log"])
    dt = torch.nn.functional.softplus(v["dt"][:length] + v["dt_bias"])
    b, c = (t[:length].repeat_interleave(2, dim=1) for t in (v["b"], v["c"]))
    x = v["xs"][:length]
    if clamped:
        want, state = chunked_scan(x, dt.clamp(min=0.05), a, b, c, torch.zeros(4, 8, 16), chunk=4)
    else:
        state, outs = torch.zeros(4, 8, 16), []
        for t in range(length):
            out, state = scan_step(x[t], dt[t], a, b[t], c[t], state)
            outs.append(out)
        want = torch.stack(outs)
    want = want + v["d"][:, None] * x
    assert (y[:length] - want).abs().max().item() <= 1e-5 and (final[0] - state).abs().max().item() <= 1e-5
