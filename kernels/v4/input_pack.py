"""V4's input pack (spec §8; upstream models/deepseek_v4_pro/input_pack.py): the token embeddings as the first
layer's residual streams.

x_hc[t, c] = FP32(embed_weight[clamp(input_ids[t], 0, vocab - 1)]) for every stream c of ``hc_mult``: an id below
0 reads row 0 and an id at or past the vocabulary reads its last row (clamped, never wrapped); the BF16 row is
widened to FP32 exactly, and every stream holds the same row. Upstream judges it exactly (rtol = atol = 0).
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator

SPEC = "§8"


@operator(returns="x_hc [T, hc, D] FP32: each id's embedding row (ids clamped into the vocabulary), widened "
                  "exactly, in every stream", spec="§8")
def v4_embed_pack(input_ids: torch.Tensor, embed_weight: torch.Tensor, *, config) -> torch.Tensor:
    """input_ids [T] integer, embed_weight [vocab, hidden] BF16 -> x_hc [T, hc_mult, hidden] FP32."""
    check_embed_pack_inputs(input_ids, embed_weight, config=config)
    ids = input_ids.to(torch.int64).clamp(0, embed_weight.shape[0] - 1)
    rows = embed_weight.index_select(0, ids).to(torch.float32)
    return rows.unsqueeze(1).expand(-1, config.hc_mult, -1).contiguous()


def check_embed_pack_inputs(input_ids: torch.Tensor, embed_weight: torch.Tensor, *, config) -> None:
    """``v4_embed_pack``'s input validation alone (what another implementation must refuse the same way)."""
    if input_ids.ndim != 1 or input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise ContractInputError("input_ids", None, "[T] integer ids", f"{input_ids.dtype}{list(input_ids.shape)}",
                                 SPEC)
    if embed_weight.ndim != 2 or embed_weight.shape[1] != config.hidden_size or embed_weight.shape[0] < 1:
        raise ContractInputError("embed_weight", None, f"[vocab >= 1, {config.hidden_size}]",
                                 list(embed_weight.shape), SPEC)
    if embed_weight.dtype != torch.bfloat16:
        raise ContractInputError("embed_weight", None, "BF16", embed_weight.dtype, SPEC)
