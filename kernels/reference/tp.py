"""Tensor-parallel reduction of attention output partials, simulated on the CPU across ranks.

Every rank produces an FP32 partial [T, D] of the output projection for its heads. The replicated wiring
all-reduces them: the partials are summed in FP32 in rank order and the completed sum is cast to BF16 once,
so every rank holds the same bytes. The sharded wiring reduce-scatters them: the same sum, then each rank
keeps the rows of its physical owner slab (``ceil(capacity/TP)`` rows, §7.1) and writes its padding rows
as exact zeros.

Spec: §7.1 (ReduceScatter(SUM) of the FP32 partials, one BF16 cast; inactive rows 0), upstream_checks
AP-08, SP-05, SP-09.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.sequence_parallel import sp_bounds

SPEC = "§7.1"
ROUNDING_VERSION = "tp-1"


def _check(partials: Sequence[torch.Tensor]) -> None:
    if not partials:
        raise ContractInputError("partials", None, "one FP32 partial per rank", 0, SPEC)
    first = partials[0]
    for rank, p in enumerate(partials):
        if p.dtype != torch.float32 or p.ndim != 2 or tuple(p.shape) != tuple(first.shape):
            raise ContractInputError("partials", (rank,), f"FP32 {list(first.shape)} like rank 0",
                                     f"{p.dtype}{list(p.shape)}", SPEC)


@operator(returns='[T, D] BF16: FP32 sum in rank order, one BF16 cast', spec='§7.1')
def tp_all_reduce(partials: Sequence[torch.Tensor]) -> torch.Tensor:
    """Sum the FP32 partials [T, D] in rank order, then one cast to BF16. Spec: §7.1, AP-08."""
    _check(partials)
    total = torch.zeros_like(partials[0])
    for p in partials:
        total += p
    return total.to(torch.bfloat16)


@operator(returns='list of BF16 owner slabs [ceil(capacity/TP), D], padding rows zero', spec='§7.1')
def tp_reduce_scatter(partials: Sequence[torch.Tensor], *, active_tokens: int, capacity: int | None = None
                      ) -> list[torch.Tensor]:
    """The all-reduced rows, split into the ranks' physical owner slabs [ceil(capacity/TP), D]: owned rows
    ``[first, first + count)`` of the active prefix, padding rows exactly zero. Spec: §7.1, SP-05, SP-09."""
    _check(partials)
    reduced = tp_all_reduce(partials)
    if not 0 <= active_tokens <= reduced.shape[0]:
        raise ContractInputError("active_tokens", None, f"0..{reduced.shape[0]} (rows of the partials)",
                                 active_tokens, SPEC)
    slabs = []
    for b in sp_bounds(active_tokens, len(partials), capacity):
        slab = torch.zeros((b.width, reduced.shape[1]), dtype=torch.bfloat16)
        slab[: b.count] = reduced[b.first:b.first + b.count]
        slabs.append(slab)
    return slabs
