"""The gated delta rule's segment kernel against its torch reference, and the reference against the model's own
chunked rule and decode step: fresh and continued segments, a snapshot, decode tokens."""

from __future__ import annotations

import torch

from mm_infer_kernels import gated_delta_segments as gd
from mm_infer_kernels.mamba_segments import Segments

SEGMENTS = [(0, 9, 0, 9, -1), (9, 4, 6, 12, 1), (13, 1, 20, 12, 0), (14, 3, 0, 3, -1)]
SNAPS = [[2, 5], [], [], [3]]
ROWS = 19  # two padding rows


def _inputs(device):
    from mm_infer.models.gated_delta import l2norm

    g = torch.Generator().manual_seed(0)
    h, dk, dv = 4, 16, 24
    q, k = l2norm(torch.randn(ROWS, h, dk, generator=g)) * dk**-0.5, l2norm(torch.randn(ROWS, h, dk, generator=g))
    return dict(q=q.to(device), k=k.to(device), v=torch.randn(ROWS, h, dv, generator=g).to(device),
                g=(-torch.rand(ROWS, h, generator=g)).to(device), beta=torch.rand(ROWS, h, generator=g).to(device),
                pool=(0.3 * torch.randn(3, h, dk, dv, generator=g)).to(device))


def test_gated_delta_triton_equals_reference(device):
    # catches: a state read from the wrong slot, the decay applied after the update, the snapshot of the wrong token
    v = _inputs(device)
    seg = Segments.build(SEGMENTS, SNAPS, device)
    args = (v["q"], v["k"], v["v"], v["g"], v["beta"], v["pool"], seg)
    for a, b in zip(gd.gated_delta_triton(*args), gd.gated_delta_reference(*args), strict=True):
        assert (a - b).abs().max().item() <= 1e-5


def test_the_reference_is_the_models_chunked_rule():
    from mm_infer.models.gated_delta import chunked_gated_delta

    v = _inputs(torch.device("cpu"))
    seg = Segments.build([(0, 17, 0, 17, -1)], [[]], torch.device("cpu"))
    o, final, _ = gd.gated_delta_reference(v["q"], v["k"], v["v"], v["g"], v["beta"], v["pool"], seg)
    want, state = chunked_gated_delta(v["q"][:17], v["k"][:17], v["v"][:17], v["g"][:17], v["beta"][:17],
                                      torch.zeros(4, 16, 24), chunk=8)
    assert (o[:17] - want).abs().max().item() <= 1e-5 and (final[0] - state).abs().max().item() <= 1e-5
