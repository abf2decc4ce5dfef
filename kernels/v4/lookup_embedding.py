"""V4-Flash's token embedding lookup (spec §8; upstream models/deepseek_v4_flash_{mtp,dspark}/lookup_embedding.py):
the packed prefill or decode ids' rows of the BF16 embedding table, copied as they are.

hidden_states[t] = embed_weight[input_ids[t]] for every t < T: the BF16 row, bit for bit (no widening, no
rounding: upstream judges it with rtol = atol = 0). Unlike V4-Pro's input pack (``v4_embed_pack``: ids clamped into
the vocabulary, rows widened to the hc streams), the Flash lookup has no clamp: its kernel reads row ``id`` whatever
it is, so an id outside [0, vocab) is the caller's error and is refused here, naming the row.
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, Upstream, replaced

SPEC = "§8"


def check_lookup_inputs(input_ids: torch.Tensor, embed_weight: torch.Tensor, *, config) -> None:
    """``lookup_embedding``'s input validation alone (what another implementation must refuse the same way)."""
    if input_ids.ndim != 1 or input_ids.dtype not in (torch.int32, torch.int64):
        raise ContractInputError("input_ids", None, "[T] INT64 (or INT32) ids", f"{input_ids.dtype}"
                                 f"{list(input_ids.shape)}", SPEC)
    if embed_weight.ndim != 2 or embed_weight.shape[1] != config.hidden_size or embed_weight.shape[0] < 1:
        raise ContractInputError("embed_weight", None, f"[vocab >= 1, {config.hidden_size}]",
                                 list(embed_weight.shape), SPEC)
    if embed_weight.dtype != torch.bfloat16:
        raise ContractInputError("embed_weight", None, "BF16", embed_weight.dtype, SPEC)
    bad = (input_ids < 0) | (input_ids >= embed_weight.shape[0])
    if bool(bad.any()):
        t = int(bad.nonzero()[0])
        raise ContractInputError("input_ids", (t,), f"an id in [0, {embed_weight.shape[0]})", int(input_ids[t]),
                                 SPEC)


@operator(returns="hidden_states [T, D] BF16: each id's embedding row, bit for bit (ids outside the vocabulary "
                  "refused)", spec="§8")
def lookup_embedding(input_ids: torch.Tensor, embed_weight: torch.Tensor, *, config) -> torch.Tensor:
    """input_ids [T] INT64 (or INT32), embed_weight [vocab, hidden] BF16 -> hidden_states [T, hidden] BF16."""
    check_lookup_inputs(input_ids, embed_weight, config=config)
    return embed_weight.index_select(0, input_ids.to(torch.int64)).contiguous()


# --- the record ----------------------------------------------------------------------------------------------

def _lookup_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """A 40-row table of every kind of BF16 value (subnormals, ±0, infinities, NaN among random rows) and 11 ids
    with repeats, id 0 and the last id: a widened, rounded, clamped or shifted row shows."""
    g = torch.Generator().manual_seed(seed)
    vocab = 40
    table = torch.randint(-(2**15), 2**15, (vocab, config.hidden_size), generator=g, dtype=torch.int16)
    ids = torch.tensor([0, 1, 17, vocab - 1, 17, 2, vocab // 2, 1, vocab - 2, 0, 33], dtype=torch.int64)
    return {"input_ids": ids, "embed_weight": table.view(torch.bfloat16)}


def _lookup_call(fn, i: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    return {"hidden_states": fn(i["input_ids"], i["embed_weight"], config=config)}


_FLASH_ONLY = "V4-Pro packs the embedding into the hc streams instead (input_pack.py, operator v4_embed_pack)"

RECORD = Record(
    operator="lookup_embedding",
    call=_lookup_call,
    outputs={"hidden_states": "exact"},
    cases=(CaseSpec("lookup_embedding", "V4-Flash embedding lookup: 11 ids (repeats, 0, the last id) into a 40-row "
                    "table holding every kind of BF16 value, copied bit for bit", _lookup_inputs,
                    geometries=("flash-tiny", "v4-flash")),),
    bad_calls=(
        BadCall("an id at the vocabulary", "lookup_embedding", replaced(input_ids=torch.tensor([0, 40])),
                "input_ids"),
        BadCall("a negative id", "lookup_embedding", replaced(input_ids=torch.tensor([3, -1, 0])), "input_ids"),
        BadCall("FP32 ids", "lookup_embedding", replaced(input_ids=torch.tensor([0.0, 1.0])), "input_ids"),
        BadCall("an FP32 table", "lookup_embedding", replaced(embed_weight=lambda i: i["embed_weight"].float()),
                "embed_weight"),
        BadCall("a table of another width", "lookup_embedding",
                replaced(embed_weight=lambda i: i["embed_weight"][:, :-2]), "embed_weight"),
    ),
    bindings=(
        Upstream("deepseek_v4_pro", none=_FLASH_ONLY),
        Upstream("deepseek_v4_flash_mtp", golden="lookup_embedding.py::golden_lookup_embedding_test",
                 entry="lookup_embedding.py::lookup_embedding_test"),
        # dspark's golden and entry also fill x_hc [T, hc, D] FP32 (the rows in every stream), not returned here
        Upstream("deepseek_v4_flash_dspark", golden="lookup_embedding.py::golden_lookup_embedding_test",
                 entry="lookup_embedding.py::lookup_embedding_test"),
    ),
)
