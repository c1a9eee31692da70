"""Host-side tables that map a flat grid of row blocks onto variable-sized items (one launch per batch)."""

from __future__ import annotations

import torch


def row_blocks(rows_per_item: list[int], block_rows: int,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(block_item [nb] int32, block_row [nb] int32): item id and first item-local row of each row block."""
    rows = torch.tensor(rows_per_item, dtype=torch.int64)  # [n]
    nblk = (rows + block_rows - 1) // block_rows  # [n]
    block_item = torch.repeat_interleave(torch.arange(len(rows_per_item)), nblk)  # [nb]
    first = torch.cumsum(nblk, 0) - nblk  # [n] first block of each item
    block_row = (torch.arange(int(nblk.sum())) - first[block_item]) * block_rows  # [nb]
    return block_item.to(device=device, dtype=torch.int32), block_row.to(device=device, dtype=torch.int32)


def exclusive_cumsum(values: list[int]) -> list[int]:
    """[a, b, c] -> [0, a, a+b]."""
    out, acc = [], 0
    for v in values:
        out.append(acc)
        acc += v
    return out


def sizes_list(sizes: torch.Tensor | list, width: int, name: str) -> list[list[int]]:
    """Validate an [n, width] integer table (tensor on any device, or nested list) and return it as lists."""
    if isinstance(sizes, torch.Tensor):
        if sizes.dtype.is_floating_point or sizes.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got {sizes.dtype}")
        if sizes.ndim != 2 or sizes.shape[1] != width:
            raise ValueError(f"{name} must be [n, {width}], got {tuple(sizes.shape)}")
        sizes = sizes.tolist()
    rows = [[int(v) for v in r] for r in sizes]
    if any(len(r) != width for r in rows):
        raise ValueError(f"{name} rows must have {width} entries")
    if any(v <= 0 for r in rows for v in r):
        raise ValueError(f"{name} entries must be positive, got {rows}")
    return rows
