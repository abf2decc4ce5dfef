"""Small tensor helpers shared by checks and contracts."""

from __future__ import annotations

import torch


def byte_view(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t`` as a flat uint8 tensor (works for bf16/fp8/empty tensors)."""
    flat = t.detach().cpu().contiguous().reshape(-1)
    if flat.numel() == 0:
        return torch.empty(0, dtype=torch.uint8)
    return flat.view(torch.uint8)


def byte_rows(t: torch.Tensor) -> torch.Tensor:
    """``[rows, bytes_per_row]`` uint8 view of a tensor whose first dim is rows."""
    rows = t.shape[0] if t.ndim else 1
    return byte_view(t).reshape(rows, -1) if rows else torch.empty((0, 0), dtype=torch.uint8)
