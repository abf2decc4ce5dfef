"""V4-Flash dspark's context-parallel prefill KV all-gather (spec §7.1, §8; upstream
models/deepseek_v4_flash_dspark/prefill_kv_allgather.py): each rank's token rows of a prefill chunk gathered, in rank
order, onto every rank.

``hidden_local [tp, local_t, D]`` BF16 holds rank r's ``local_t`` rows (the chunk's tokens r * local_t ..
(r + 1) * local_t - 1, a contiguous slab per rank); every rank ends up holding ``group_out [tp * local_t, D]``, the
rank-major concatenation, which is the unsplit chunk's rows. Nothing is computed: every byte is copied. Upstream
compiles TP 1, 2 and 4 and a group window of 8192 rows (``local_t <= 8192 / tp``); its exchange is a distributed
window with a signal per rank, this operator its data movement.
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, Upstream, replaced

SPEC = "§7.1"
TP_SIZES = (1, 2, 4)  # upstream's _TP_CHOICES
GROUP_CAP = 8192  # upstream's PREFILL_GROUP_CAP: the rows the group window holds


def check_kv_allgather(hidden_local: torch.Tensor) -> None:
    """The caller's side: [tp, local_t, D] BF16 for a compiled tp, 1 <= local_t <= 8192 / tp, D >= 1."""
    if hidden_local.ndim != 3 or hidden_local.shape[2] == 0:
        raise ContractInputError("hidden_local", None, "[tp, local_t, D] with D >= 1", list(hidden_local.shape),
                                 SPEC)
    tp, local_t, _ = hidden_local.shape
    if tp not in TP_SIZES:
        raise ContractInputError("hidden_local", None, f"a TP world of {TP_SIZES} ranks (dim 0)", tp, SPEC)
    if not 1 <= local_t <= GROUP_CAP // tp:
        raise ContractInputError("hidden_local", None, f"1 .. {GROUP_CAP // tp} rows per rank (dim 1: the group "
                                 f"window holds {GROUP_CAP})", local_t, SPEC)
    if hidden_local.dtype != torch.bfloat16:
        raise ContractInputError("hidden_local", None, "BF16", hidden_local.dtype, SPEC)


@operator(returns="group_out [tp, tp*local_t, D] BF16: on every rank, the ranks' rows concatenated in rank order",
          spec=SPEC)
def prefill_kv_allgather(hidden_local: torch.Tensor) -> torch.Tensor:
    """hidden_local [tp, local_t, D] BF16 -> group_out [tp, tp * local_t, D] (module docstring)."""
    check_kv_allgather(hidden_local)
    tp, local_t, d = hidden_local.shape
    return hidden_local.reshape(1, tp * local_t, d).expand(tp, -1, -1).contiguous()


# --- the record ----------------------------------------------------------------------------------------------

def _slabs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """TP 2 with 5 rows per rank (tiny) or TP 2 with upstream's fixture count, 257 rows per rank (dspark's width),
    rows of arbitrary finite BF16 values: a token-major interleave, a rank order reversed or a row dropped shows."""
    g = torch.Generator().manual_seed(seed)
    local_t = 5 if config.hidden_size < 1024 else 257
    raw = torch.randint(-(2**15), 2**15, (2, local_t, config.hidden_size), generator=g, dtype=torch.int16)
    return {"hidden_local": raw.view(torch.bfloat16).nan_to_num(0.0, 1.0, -1.0)}


def _call(fn, i: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    return {"group_out": fn(i["hidden_local"])}


RECORD = Record(
    operator="prefill_kv_allgather",
    call=_call,
    outputs={"group_out": "exact"},
    cases=(CaseSpec("prefill_kv_allgather", "V4-Flash dspark CP prefill KV all-gather, TP 2: each rank's slab of "
                    "rows gathered in rank order onto both ranks, byte for byte", _slabs,
                    geometries=("flash-tiny", "v4-flash")),),
    bad_calls=(
        BadCall("a TP world of 3", "prefill_kv_allgather",
                replaced(hidden_local=lambda i: torch.cat((i["hidden_local"], i["hidden_local"][:1]))),
                "hidden_local"),
        BadCall("FP32 rows", "prefill_kv_allgather", replaced(hidden_local=lambda i: i["hidden_local"].float()),
                "hidden_local"),
        BadCall("no row per rank", "prefill_kv_allgather",
                replaced(hidden_local=lambda i: i["hidden_local"][:, :0]), "hidden_local"),
    ),
    bindings=(
        Upstream("deepseek_v4_pro", none="V4-Pro has no context-parallel prefill"),
        Upstream("deepseek_v4_flash_mtp", none="Flash-MTP's CP prefill exchanges segment tails instead "
                                               "(cp_zigzag_tail_exchange)"),
        Upstream("deepseek_v4_flash_dspark", golden="prefill_kv_allgather.py::golden_prefill_kv_allgather",
                 entry="prefill_kv_allgather.py::l3_prefill_kv_allgather_fixture"),
    ),
)
