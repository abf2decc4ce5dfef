"""V4's attention is data-parallel only (spec §8: "no tensor parallelism -- attention is data-parallel, MoE is
expert-parallel"): every DP rank runs the attention of its own requests on its own caches, whole (TP 1), and
nothing reduces attention outputs across ranks; only the MoE crosses ranks.

``dp_attention`` runs each rank's inputs through one attention of the backend and returns every rank's outputs
as they are: for a V4 path (``kind`` "HCA", "CSA" or "SWA", ``config`` a V4 preset) the backend's
``v4_attention`` on the rank's decode inputs (``q``, ``ori_kv``, ``window_indices``, ``cmp_kv``,
``cmp_block_table``, ``compressed`` (absent for SWA), ``position_ids``, ``attn_sink``, ``freqs_cos``,
``freqs_sin``, ``wo_a``, ``wo_b``, ``wo_b_scale``) -> {"attn_out"}; for a V4.1 ``LayerKind`` (with a V4.1 config) the backend's
``attention_half_layer`` at TP 1 (replicated wiring), kept so the DP rule is also checked on the half-layer.

Spec: §8.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator

SPEC = "§8"


@operator(returns="list of each rank's half-layer outputs (TP 1, nothing reduced across ranks), "
                   "composed from this backend's attention_half_layer",
          spec='§8')
def dp_attention(rank_inputs: Sequence[Mapping[str, torch.Tensor]], *, kind, config,
                 ops: Mapping[str, Callable] | None = None) -> list[dict[str, torch.Tensor]]:
    """One attention per DP rank (a V4 path's ``v4_attention``, or a V4.1 half-layer at TP 1 with one rank
    holding all heads) -> each rank's outputs, untouched by the other ranks. Spec: §8."""
    from kernels.config import LayerKind, V4Config
    from kernels.reference.attention_layer import attention_half_layer
    from kernels.v4.sparse_attention import PATHS, v4_attention

    if not rank_inputs:
        raise ContractInputError("rank_inputs", None, "one input set per DP rank (at least one)", 0, SPEC)
    if isinstance(config, V4Config):
        if kind not in PATHS or isinstance(kind, LayerKind):
            raise ContractInputError("kind", None, f"a V4 path {PATHS} with a V4 config", kind, SPEC)
        attend = (ops or {}).get("v4_attention", v4_attention)
        if ops and getattr(attend, "composes_operators", False):
            attend = partial(attend, ops=ops)
        names = ("q", "ori_kv", "window_indices", "cmp_kv", "cmp_block_table")
        after = ("position_ids", "attn_sink", "freqs_cos", "freqs_sin", "wo_a", "wo_b", "wo_b_scale")
        outs = []
        for r, inputs in enumerate(rank_inputs):
            missing = [n for n in names + after if n not in inputs]
            if missing:
                raise ContractInputError(f"rank_inputs[{r}]", None, "every v4_attention input", missing, SPEC)
            outs.append({"attn_out": attend(kind, *(inputs[n] for n in names), inputs.get("compressed"),
                                            *(inputs[n] for n in after), config=config)})
        return outs
    attention = (ops or {}).get("attention_half_layer", attention_half_layer)
    if ops and getattr(attention, "composes_operators", False):  # the half-layer composes the backend's operators
        attention = partial(attention, ops=ops)
    return [dict(attention(dict(inputs), kind=kind, phase="decode", wiring="replicated", tp=1, config=config))
            for inputs in rank_inputs]


dp_attention.composes_operators = True
