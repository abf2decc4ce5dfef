"""One matrix product shared by the references whose results must not depend on the other rows of a batch.

``rowwise_matmul(x, w)`` = x · wᵀ accumulated in FP64 and rounded once to FP32, computed as an elementwise
product and a reduction over the last dim: a row's result never depends on how many rows are in the batch or
where it sits (no batch-size dependent BLAS blocking), so EP size, token order, padding and vocab sharding
cannot move a bit. x [..., K], w [M, K] -> [..., M] FP32.
"""

from __future__ import annotations

import torch


def rowwise_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.double()[..., None, :] * w.double()).sum(-1).float()
