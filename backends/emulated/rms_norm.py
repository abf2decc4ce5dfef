"""The RMSNorm device arithmetic, written apart from the reference (``--backend emulated``).

As upstream's rms_norm kernel runs it (models/deepseek_v4_pro/rmsnorm.py): each row's sum of squares in FP32,
tile by tile along D (``D_TILE`` = 128 columns, each tile's row sum added to the running FP32 total in order);
the mean as that total times the FP32 constant 1 / D (a multiply, not a division); rsqrt of mean + eps; then
x · inv_rms times the weight in FP32, rounded once to BF16. The reference sums all D squares at once and divides
by D: the two differ in the last FP32 bits, and so, near a BF16 midpoint, in one BF16 step of the output.
"""

from __future__ import annotations

import torch

from kernels.reference.lm_head import check_final_norm  # validation only: same refusals

D_TILE = 128


def tiled_final_norm(hidden: torch.Tensor, weight: torch.Tensor, *, config) -> torch.Tensor:
    """Same signature and result contract as ``kernels.reference.lm_head.final_norm``."""
    check_final_norm(hidden, weight)
    x = hidden.to(torch.float32)
    total = torch.zeros(x.shape[0], dtype=torch.float32)
    for d0 in range(0, x.shape[1], D_TILE):
        tile = x[:, d0:d0 + D_TILE]
        total = total + (tile * tile).sum(dim=1)
    inv_d = torch.tensor(1.0 / x.shape[1], dtype=torch.float32)
    inv_rms = torch.rsqrt(total * inv_d + torch.tensor(config.rms_norm_eps, dtype=torch.float32))
    return ((x * inv_rms[:, None]) * weight.to(torch.float32)).to(torch.bfloat16)
