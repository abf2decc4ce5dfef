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
from kernels.record import BadCall, CaseSpec, Record, Upstream, generator, replaced

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


# --- the record ----------------------------------------------------------------------------------------------

def _embed_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """Upstream's fixture ids (-1, 0, 17, the last row, the vocabulary and 7 past it, 2, 1) over a 32-row table."""
    g = generator(seed)
    vocab = 32
    ids = torch.tensor([-1, 0, 17, vocab - 1, vocab, vocab + 7, 2, 1], dtype=torch.int64)
    return {"input_ids": ids, "embed_weight": torch.randn(vocab, config.hidden_size, generator=g).to(torch.bfloat16)}


RECORD = Record(
    operator="v4_embed_pack",
    call=lambda fn, i, config: {"x_hc": fn(i["input_ids"], i["embed_weight"], config=config)},
    outputs={"x_hc": "exact"},
    cases=(CaseSpec("v4_embed_pack", "V4 input pack: upstream's fixture ids (below 0, at and past the vocabulary) "
                    "clamped into a 32-row table, each row widened to FP32 in every stream", _embed_inputs),),
    bad_calls=(BadCall("an FP32 table", "v4_embed_pack", replaced(embed_weight=lambda i: i["embed_weight"].float()),
                       "embed_weight"),
               BadCall("FP32 ids", "v4_embed_pack", replaced(input_ids=lambda i: i["input_ids"].float()),
                       "input_ids")),
    bindings=(Upstream("deepseek_v4_pro", golden="input_pack.py::golden_pack_x_hc",
                       entry="input_pack.py::pack_x_hc_test"),
              *(Upstream(f, none="no input pack: the Flash folders look the rows up (lookup_embedding.py, operator "
                                 "lookup_embedding)") for f in ("deepseek_v4_flash_mtp", "deepseek_v4_flash_dspark"))),
)
