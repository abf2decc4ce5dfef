"""V4-Flash's RoPE table expansion (spec §4.2; upstream models/deepseek_v4_flash_{mtp,dspark}/rope_interleave.py):
the half-width cos / sin rows a RoPE table holds, widened to the interleaved lanes the Flash kernels rotate.

For every row b and rope lane j < R (R = 2 * the table's width):

    cos_il[b, j]     = cos_half[b, j >> 1]
    sin_signed[b, j] = sin_half[b, j >> 1] * (-1 if j is even else +1)

so that a rotation of the interleaved pairs (x[2i], x[2i+1]) by the row's angles is
``out[j] = x[j] * cos_il[j] + x[j ^ 1] * sin_signed[j]`` (the inverse: ``x[j] * cos_il[j] - x[j ^ 1] *
sin_signed[j]``), the same rotation ``kernels.reference.rope.rope_interleave`` computes from the half-width rows.
Both outputs are FP32 and exact: a copy, and a multiplication by ±1, which only sets the sign bit (a +0 sine on an
even lane is -0, a NaN keeps its payload). Upstream builds them once per layer for every consumer (the indexer,
its compressor, the attention's inverse rotation); its kernel is an inline helper with no golden of its own.
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, Upstream, replaced

SPEC = "§4.2"


def check_rope_interleave(cos_half: torch.Tensor, sin_half: torch.Tensor) -> None:
    """The caller's side: two 2-D FP32 tables of one shape, at least one column."""
    for name, t in (("cos_half", cos_half), ("sin_half", sin_half)):
        if t.ndim != 2 or t.shape[1] < 1:
            raise ContractInputError(name, None, "[B, R/2] with R/2 >= 1", list(t.shape), SPEC)
        if t.dtype != torch.float32:
            raise ContractInputError(name, None, "FP32", t.dtype, SPEC)
    if cos_half.shape != sin_half.shape:
        raise ContractInputError("sin_half", None, f"the shape of cos_half {list(cos_half.shape)}",
                                 list(sin_half.shape), SPEC)


def lane_signs(width: int) -> torch.Tensor:
    """[-1, +1, -1, +1, ...] over ``width`` rope lanes (FP32): the sign folded into the sine of each lane."""
    return torch.tensor([-1.0, 1.0], dtype=torch.float32).repeat(width // 2)


@operator(returns="(cos_il [B, R] FP32, sin_signed [B, R] FP32): lane j holds the row's angle j >> 1, the sine "
                  "negated on even lanes", spec=SPEC)
def v4_rope_interleave(cos_half: torch.Tensor, sin_half: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos_half, sin_half [B, R/2] FP32 -> (cos_il, sin_signed) [B, R] FP32 (module docstring)."""
    check_rope_interleave(cos_half, sin_half)
    cos_il = cos_half.repeat_interleave(2, dim=1)
    sin_signed = sin_half.repeat_interleave(2, dim=1) * lane_signs(2 * sin_half.shape[1])
    return cos_il.contiguous(), sin_signed.contiguous()


# --- the record ----------------------------------------------------------------------------------------------

def _tables(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """The decode batch's rows of the model's own RoPE tables (rope width of the preset) at scattered positions,
    with one row of every special FP32 value (±0, ±inf, NaN, a subnormal) in place of the last position: a
    half-width layout, a flipped sign pattern, a negation instead of a multiplication or a shifted lane shows."""
    from kernels.reference.rope import precompute_rope_tables

    g = torch.Generator().manual_seed(seed)
    half = config.qk_rope_head_dim // 2
    rows = 4
    pos = torch.randint(0, 4096, (rows,), generator=g)
    cos, sin = precompute_rope_tables(4096, False, config)
    cos_half, sin_half = cos[pos].clone(), sin[pos].clone()
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, -1e-45, 1.0])
    sin_half[-1] = special.repeat(-(-half // special.numel()))[:half]
    cos_half[-1] = special.flip(0).repeat(-(-half // special.numel()))[:half]
    return {"cos_half": cos_half, "sin_half": sin_half}


def _call(fn, i: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    cos_il, sin_signed = fn(i["cos_half"], i["sin_half"])
    return {"cos_il": cos_il, "sin_signed": sin_signed}


_INLINE = "an inline helper (@pl.jit.inline) with no golden and no entry of its own; its consumers' goldens " \
          "(the indexer, the compressors, the sparse attention) build the same rows inline"

RECORD = Record(
    operator="v4_rope_interleave",
    call=_call,
    outputs={"cos_il": "exact", "sin_signed": "exact"},
    cases=(CaseSpec("v4_rope_interleave", "V4-Flash RoPE table expansion: four rows of the model's RoPE table and a "
                    "row of every special FP32 value widened to interleaved lanes, the sine signed -, +, -, +",
                    _tables, geometries=("flash-tiny", "v4-flash")),),
    bad_calls=(
        BadCall("tables of two shapes", "v4_rope_interleave",
                replaced(sin_half=lambda i: i["sin_half"][:, :-1]), "sin_half"),
        BadCall("a BF16 cosine table", "v4_rope_interleave",
                replaced(cos_half=lambda i: i["cos_half"].to(torch.bfloat16)), "cos_half"),
        BadCall("a 1-D sine table", "v4_rope_interleave", replaced(sin_half=lambda i: i["sin_half"][0]),
                "sin_half"),
    ),
    bindings=(
        Upstream("deepseek_v4_pro", none="V4-Pro's kernels build the interleaved rows inside each consumer (no "
                                         "module of their own)"),
        Upstream("deepseek_v4_flash_mtp", none=_INLINE),
        Upstream("deepseek_v4_flash_dspark", none=_INLINE),
    ),
)
