"""V4-Flash dspark's main-hidden projection (spec §8; upstream models/deepseek_v4_flash_dspark/dspark_proj.py): the
drafter collapses the hidden rows of the target layers it reads into one drafter row.

``main_hidden`` [T, L·D] BF16 is the L target layers' hidden rows side by side (upstream reads L = 3 layers),
``main_proj_w`` [D, L·D] BF16 the projection (kept BF16: a plain replicated linear, not W8A8), ``main_norm_w`` [D]
BF16 the RMSNorm weight:

1. projected[t, j] = Σ_k main_hidden[t, k] · main_proj_w[j, k] (BF16 operands, FP32 accumulation; here an FP64 sum
   rounded to FP32 once), **rounded to BF16** -- the projection is staged in BF16 before the norm;
2. main_x = final_norm(projected, main_norm_w): FP32 RMSNorm times the weight, one BF16 rounding (composed from
   the backend's ``final_norm``).

Shape-generic in T, L and D (the golden is; the entry compiles D = hidden_size and L = 3).
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, dspark_only, generator, replaced

SPEC = "§8"


def check_dspark_proj(main_hidden: torch.Tensor, main_proj_w: torch.Tensor, main_norm_w: torch.Tensor) -> None:
    """The caller's side: BF16 [T >= 1, L·D], [D, L·D] and [D] with L >= 1."""
    if main_norm_w.ndim != 1 or main_norm_w.shape[0] < 1 or main_norm_w.dtype != torch.bfloat16:
        raise ContractInputError("main_norm_w", None, "BF16 [D >= 1]", f"{main_norm_w.dtype}{list(main_norm_w.shape)}",
                                 SPEC)
    d = main_norm_w.shape[0]
    if (main_proj_w.ndim != 2 or main_proj_w.shape[0] != d or main_proj_w.shape[1] < d or main_proj_w.shape[1] % d
            or main_proj_w.dtype != torch.bfloat16):
        raise ContractInputError("main_proj_w", None, f"BF16 [{d}, L·{d}] (L target layers)",
                                 f"{main_proj_w.dtype}{list(main_proj_w.shape)}", SPEC)
    width = main_proj_w.shape[1]
    if (main_hidden.ndim != 2 or main_hidden.shape[0] < 1 or main_hidden.shape[1] != width
            or main_hidden.dtype != torch.bfloat16):
        raise ContractInputError("main_hidden", None, f"BF16 [T >= 1, {width}]",
                                 f"{main_hidden.dtype}{list(main_hidden.shape)}", SPEC)


def projected_rows(main_hidden: torch.Tensor, main_proj_w: torch.Tensor) -> torch.Tensor:
    """Step 1: main_hidden · main_proj_wᵀ, an FP64 sum rounded to FP32 once, then to BF16."""
    return (main_hidden.double() @ main_proj_w.double().T).float().to(torch.bfloat16)


@operator(returns="main_x [T, D] BF16: final_norm of the BF16-staged projection main_hidden · main_proj_wᵀ -- "
                  "composed from this backend's final_norm", spec=SPEC)
def dspark_proj(main_hidden: torch.Tensor, main_proj_w: torch.Tensor, main_norm_w: torch.Tensor, *, config,
                ops=None) -> torch.Tensor:
    """The drafter's main-hidden projection (module docstring)."""
    from kernels.reference.lm_head import final_norm

    check_dspark_proj(main_hidden, main_proj_w, main_norm_w)
    norm = (ops or {}).get("final_norm", final_norm)
    return norm(projected_rows(main_hidden, main_proj_w), main_norm_w, config=config)


dspark_proj.composes_operators = True


# --- the record ----------------------------------------------------------------------------------------------

LAYERS = 3  # upstream's dspark_target_layer_ids


def _proj_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """Upstream's fixture at ``config``'s width: 8 rows of the 3 target layers ~ N(0, 1), the projection
    ~ N(0, 1/(3·D)) and the norm weight ~ 1 + N(0, 0.01), all BF16; row 5 is 1000x (the norm must take it back)."""
    g = generator(seed)
    d = config.hidden_size
    hidden = torch.randn(8, LAYERS * d, generator=g)
    hidden[5] *= 1e3
    return {"main_hidden": hidden.to(torch.bfloat16),
            "main_proj_w": (torch.randn(d, LAYERS * d, generator=g) / (LAYERS * d) ** 0.5).to(torch.bfloat16),
            "main_norm_w": (torch.randn(d, generator=g) * 0.1 + 1.0).to(torch.bfloat16)}



RECORD = Record(
    operator="dspark_proj",
    call=lambda fn, i, config: {"main_x": fn(i["main_hidden"], i["main_proj_w"], i["main_norm_w"], config=config)},
    outputs={"main_x": "bf16_stage"},
    cases=(CaseSpec("dspark_proj", "dspark's main-hidden projection: 8 rows of 3 target layers (one 1000x) projected "
                    "to D in BF16, then the final RMSNorm", _proj_inputs, geometries=("flash-tiny", "v4-flash")),),
    bad_calls=(
        BadCall("a hidden row of another width", "dspark_proj", replaced(main_hidden=lambda i: i["main_hidden"][:, 1:]),
                "main_hidden"),
        BadCall("a projection not a multiple of D wide", "dspark_proj",
                replaced(main_proj_w=lambda i: i["main_proj_w"][:, 1:]), "main_proj_w"),
        BadCall("an FP32 norm weight", "dspark_proj", replaced(main_norm_w=lambda i: i["main_norm_w"].float()),
                "main_norm_w"),
    ),
    bindings=dspark_only("the drafter's main-hidden projection", golden="dspark_proj.py::golden_dspark_proj",
                 entry="dspark_proj.py::dspark_proj_test"),
)
