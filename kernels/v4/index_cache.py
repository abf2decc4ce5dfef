"""V4's index-key cache quantization (spec §8; upstream indexer_cache_quant.py): after the indexer
compressor's BF16 output, each row is stored as E4M3 with one FP32 power-of-two scale.

values = the row rounded to BF16; scale = 2^ceil(log2(amax / 448)) (the power of two at or above amax / 448,
so no element exceeds the E4M3 maximum 448 after the division); payload = values / scale rounded to E4M3
(nearest even). No amax floor: an all-zero row has scale 0 and payload 0. (The query quantizer is a different
operator with an unrounded scale.)

Spec: §8; docs/coverage.md, V4 section.
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError

SPEC = "§8"
ROUNDING_VERSION = "v4-index-cache-1"
E4M3_MAX = 448.0


def index_cache_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., d] -> (payload float8_e4m3fn [..., d], scale FP32 [..., 1]). Spec: §8."""
    if x.ndim < 1 or x.shape[-1] == 0 or not x.is_floating_point():
        raise ContractInputError("x", None, "floating [..., d > 0]", f"{x.dtype}{list(x.shape)}", SPEC)
    values = x.to(torch.bfloat16).float()
    amax = values.abs().amax(dim=-1, keepdim=True)
    if not bool(torch.isfinite(amax).all()):
        row = int((~torch.isfinite(amax)).flatten().nonzero()[0, 0])
        raise ContractInputError("x", (row,), "finite values", "a NaN or infinity", SPEC)
    exponent = torch.ceil(torch.log2(amax.double() / E4M3_MAX))
    scale = torch.where(amax > 0, torch.exp2(exponent), torch.zeros_like(exponent)).float()
    payload = values / torch.where(scale > 0, scale, 1.0)  # a zero row stays zero
    return payload.to(torch.float8_e4m3fn), scale
