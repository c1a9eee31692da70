"""The layers tensor parallelism adds: a row-parallel linear (partial sums all-reduced) and vocab-parallel logits."""

from __future__ import annotations

import torch
from torch import Tensor

from mm_infer.models.half_linear import Linear, linear
from mm_infer.parallel.group import RankGroup


class RowParallelLinear(Linear):
    """Linear over this rank's slice of the input features ([out, in / size] weight); the ranks' partial outputs are
    all-reduced, and the bias (whole on every rank) is added once, after the sum."""

    def __init__(self, in_features: int, out_features: int, bias: bool, group: RankGroup) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.group = group

    def forward(self, x: Tensor) -> Tensor:  # [..., in / size] -> [..., out]
        out = self.group.all_reduce(linear(x, self.weight))
        return out if self.bias is None else out + self.bias


class VocabParallelLogits:
    """The LM head split by vocabulary rows: each rank scores its `vocab / size` tokens and the blocks are gathered,
    so every rank holds the same whole float32 logits. Each logit is one rank's whole dot product, never a sum of
    partials: only the hidden state's own TP error reaches it."""

    def __init__(self, group: RankGroup, vocab_size: int) -> None:
        self.group = group
        self.vocab_size = vocab_size
        self.rows = vocab_size // group.size

    def __call__(self, hidden: Tensor, weight: Tensor) -> Tensor:
        """hidden [N, D]; weight: this rank's [V / size, D] rows, or the whole (tied, replicated) embedding [V, D],
        of which this rank takes its rows -> float32 logits [N, V]."""
        if weight.shape[0] == self.vocab_size:
            weight = weight[self.group.rank * self.rows:(self.group.rank + 1) * self.rows]
        return self.group.gather_columns(linear(hidden, weight).float())  # [N, V]


def reduce_output(group: RankGroup):  # noqa: ANN201 - a forward hook
    """A forward hook that all-reduces a module's output (the MoE block: each rank ran its slice of every expert)."""

    def hook(module: torch.nn.Module, args: tuple, output: Tensor) -> Tensor:
        return group.all_reduce(output)

    return hook
