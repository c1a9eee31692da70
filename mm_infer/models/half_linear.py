"""Linear layers for bfloat16/float16 weights on the CPU: float32 tiles through sgemm once a batch has rows enough.

torch's CPU GEMM for half types without native hardware support (AVX2, AVX-512 without bf16) costs about one
vector pass over the weight per row: a 16-row decode step reads the weight 16 times. Upcasting the weight tile by
tile into a float32 buffer that stays in cache, then one sgemm per tile, reads the weight once. On a CPU with
native half arithmetic (AMX, AVX512-BF16/FP16) torch's own GEMM is 3-8x faster than the tiles, so which path a
dtype takes is half_gemm_path.py's choice, made once per process from the CPU's instruction sets. The products of
half inputs are exact in float32 and the sums accumulate in float32 before one rounding to the output type, as
torch's own half GEMM does; only the order of the float32 sums differs (no exactness contract covers half types:
DESIGN.md's are in float32). Single rows keep torch's half GEMV, which reads the weight at memory speed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mm_infer.models import packed_weights
from mm_infer.models.half_gemm_path import cpu_features, half_gemm_path, mv_for_single_rows

HALF_TYPES = (torch.bfloat16, torch.float16)
UPCAST_MIN_ROWS = 8  # below this torch's half GEMV is faster (scripts/bench/half_linear.py)
TILE_ELEMENTS = 1 << 19  # float32 weight elements per tile: 2 MiB, cache-resident beside the activations


def upcasts(x: Tensor, weight: Tensor) -> bool:
    """Whether linear(x, weight) takes the float32-tile path: inference on CPU, half weight, enough rows, and a CPU
    whose half GEMM is slow (half_gemm_path).

    Under batch_invariant every batch is padded to >= 16 rows (engine/runner/model_runner.py's MIN_ROWS), above
    UPCAST_MIN_ROWS, so a request's GEMMs take the one path of its dtype whatever the batch holds."""
    return (weight.dtype in HALF_TYPES and weight.device.type == "cpu" and x.device.type == "cpu"
            and x.dtype == weight.dtype and x.dim() >= 2 and x.numel() >= UPCAST_MIN_ROWS * x.shape[-1]
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            and half_gemm_path(weight.dtype) == "tiles")


def tile_rows(in_features: int) -> int:
    """Weight rows per float32 tile: TILE_ELEMENTS worth, at least 8."""
    return max(8, TILE_ELEMENTS // max(in_features, 1))


def upcast_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [..., K] @ weight [N, K].T (+ bias [N]) with float32 sums, rounded once to x's dtype -> [..., N].

    Each tile computes its block of out.T (tile [t, K] @ rows.T -> [t, M] in a float32 buffer), adds its bias and
    is rounded into out's columns: faster here than sgemm writing column blocks of out, no float32 copy of the
    whole output (prompt logprobs over a 152k vocabulary), and a row's values do not depend on M from 12 rows up
    (M >= 16 under batch_invariant).
    """
    n, k = weight.shape
    rows = x.reshape(-1, k).float()  # [M, K]
    out = torch.empty(rows.shape[0], n, dtype=x.dtype)  # [M, N]
    step = tile_rows(k)
    tile = torch.empty(min(step, n), k, dtype=torch.float32)  # [T, K], refilled per tile
    acc = torch.empty(min(step, n), rows.shape[0], dtype=torch.float32)  # [T, M]
    bias32 = None if bias is None else bias.float()  # [N]
    for start in range(0, n, step):
        part = weight[start:start + step]  # [t, K] half
        t = part.shape[0]
        tile[:t].copy_(part)
        block = torch.mm(tile[:t], rows.t(), out=acc[:t])  # [t, M]
        if bias32 is not None:
            block += bias32[start:start + t, None]
        out[:, start:start + t].copy_(block.t())  # the one rounding
    return out.view(*x.shape[:-1], n)


def single_row_mv(x: Tensor, weight: Tensor) -> bool:
    """Whether linear(x, weight) is one half-type row on the CPU where torch.mv's GEMV beats F.linear's
    (half_gemm_path.mv_for_single_rows: bf16 on CPUs with native bf16)."""
    return (x.dim() >= 2 and x.numel() == x.shape[-1] and weight.dtype in HALF_TYPES and x.dtype == weight.dtype
            and weight.device.type == "cpu" and x.device.type == "cpu" and mv_for_single_rows(weight.dtype)
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)))


def packs(x: Tensor, weight: Tensor) -> bool:
    """Whether linear(x, weight) may take oneDNN with the prepacked weight: inference on CPU in the weight's half
    type, on a CPU whose path for it is "packed" (half_gemm_path) and that multiplies it natively (oneDNN refuses
    half types elsewhere: a forced "packed" there stays on F.linear); rows of any count but a single mv row."""
    return (weight.dtype in HALF_TYPES and weight.device.type == "cpu" and x.device.type == "cpu"
            and x.dtype == weight.dtype and x.dim() >= 2 and weight.dim() == 2
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            and half_gemm_path(weight.dtype) == "packed" and cpu_features().native(weight.dtype))


def path_taken(x: Tensor, weight: Tensor) -> str:
    """Which GEMM linear(x, weight) runs: "tiles", "mv", "packed" or "torch" (F.linear)."""
    if upcasts(x, weight):
        return "tiles"
    if single_row_mv(x, weight):
        return "mv"
    return "packed" if packs(x, weight) else "torch"


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear, with half weights on the CPU going through float32 tiles at >= UPCAST_MIN_ROWS rows where the CPU's
    half GEMM is slow, and through oneDNN with a prepacked weight where it is native (packed_weights.py)."""
    path = path_taken(x, weight)
    if path == "tiles":
        return upcast_linear(x, weight, bias)
    if path == "mv":
        out = torch.mv(weight, x.reshape(-1))  # [N]
        return (out if bias is None else out + bias).view(*x.shape[:-1], weight.shape[0])
    if path == "packed" and (prepacked := packed_weights.packed(weight)) is not None:
        return packed_weights.packed_linear(x, prepacked, bias)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear (same parameters and names) whose forward is `linear`."""

    def forward(self, x: Tensor) -> Tensor:  # [..., in] -> [..., out]
        return linear(x, self.weight, self.bias)
