"""V4's attention is data-parallel only (spec §8: "no tensor parallelism -- attention is data-parallel, MoE is
expert-parallel"): every DP rank runs the attention of its own requests on its own caches, whole (TP 1), and
nothing reduces attention outputs across ranks; only the MoE crosses ranks.

``dp_attention`` runs each rank's half-layer inputs through the backend's ``attention_half_layer`` at TP 1 and
returns every rank's outputs as they are. The per-rank attention is the V4.1 half-layer until V4's HCA / CSA
attention references land (docs/coverage.md, V4 section).

Spec: §8.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial

import torch

from kernels.errors import ContractInputError

SPEC = "§8"


def dp_attention(rank_inputs: Sequence[Mapping[str, torch.Tensor]], *, kind, config,
                 ops: Mapping[str, Callable] | None = None) -> list[dict[str, torch.Tensor]]:
    """One attention half-layer per DP rank (TP 1, replicated wiring: one rank holds all heads) -> each rank's
    outputs, untouched by the other ranks. Spec: §8."""
    from kernels.reference.attention_layer import attention_half_layer

    if not rank_inputs:
        raise ContractInputError("rank_inputs", None, "one input set per DP rank (at least one)", 0, SPEC)
    attention = (ops or {}).get("attention_half_layer", attention_half_layer)
    if ops and getattr(attention, "composes_operators", False):  # the half-layer composes the backend's operators
        attention = partial(attention, ops=ops)
    return [dict(attention(dict(inputs), kind=kind, phase="decode", wiring="replicated", tp=1, config=config))
            for inputs in rank_inputs]


dp_attention.composes_operators = True
