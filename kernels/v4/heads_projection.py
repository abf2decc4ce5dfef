"""V4's decode output projection from the attention's heads (spec §8; upstream
models/deepseek_v4_flash_dspark/decode_o_proj.py, ``golden_decode_o_proj_tp1``): where dspark's decode attention
goldens stop (``v4_attention_heads``, the heads inversely rotated and rounded to BF16), its output projection
starts.

heads [T, H, hd] BF16, ``wo_a`` [G, O_LORA, H/G·hd] BF16, ``wo_b`` [D, G·O_LORA] INT8, ``wo_b_scale`` [D] FP32:
the grouped latent kept in FP32 (BF16 operands; here an FP64 sum rounded once), one INT8 row per (token, group)
(quant = 127 / amax, a true division; codes round-half-even; factor = 1 / quant), each group's exact integer
partial rounded to FP32 and scaled, the partials summed in group order, the channel scale, one BF16 rounding.
``v4_output_projection`` is this after ``output_heads`` (``project_heads``, one
implementation).

The drafter's projection (dspark's dspark_attention.py, fused into ``golden_dspark_attention`` and its kernel),
``dspark_output_projection``, is the other choice of both steps: the grouped latent **rounded to BF16**, and one
INT8 row per token over all G·O_LORA latents, one integer partial (disagreement 20 of docs/upstream.md: dspark's
own decode_o_proj.py keeps V4's rule for the target model).
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, Upstream, dspark_only, generator, int8_codes, replaced

SPEC = "§8"


def check_heads_projection(heads: torch.Tensor, wo_a: torch.Tensor, wo_b: torch.Tensor,
                           wo_b_scale: torch.Tensor, *, config) -> None:
    """The caller's side of both projections from the heads (this one and the drafter's ``dspark_output_projection``):
    shapes and dtypes against the preset."""
    h, hd, groups = config.num_attention_heads, config.head_dim, config.o_groups
    lora, d = config.o_lora_rank, config.hidden_size
    if heads.ndim != 3 or tuple(heads.shape[1:]) != (h, hd) or heads.dtype != torch.bfloat16:
        raise ContractInputError("heads", None, f"BF16 [T, {h}, {hd}]", f"{heads.dtype}{list(heads.shape)}", SPEC)
    for name, t, shape, dtype in (("wo_a", wo_a, (groups, lora, h // groups * hd), torch.bfloat16),
                                  ("wo_b", wo_b, (d, groups * lora), torch.int8), ("wo_b_scale", wo_b_scale, (d,), None)):
        if tuple(t.shape) != shape or (dtype is not None and t.dtype != dtype):
            raise ContractInputError(name, None, f"{dtype or ''} {list(shape)}".strip(), f"{t.dtype}{list(t.shape)}",
                                     SPEC)


LATENTS, ROWS = ("fp32", "bf16"), ("group", "token")  # V4's decode projection: ("fp32", "group"); the drafter's:
# ("bf16", "token") -- disagreement 20


def project_heads(heads: torch.Tensor, wo_a: torch.Tensor, wo_b: torch.Tensor, wo_b_scale: torch.Tensor, *, config,
                  latent: str = "fp32", rows: str = "group") -> torch.Tensor:
    """BF16 heads [T, H, hd] -> [T, D] BF16 through the grouped latent (an FP64 sum rounded once to FP32; with
    ``latent="bf16"`` rounded on to BF16), INT8 rows (quant = 127 / amax, a true division; codes round-half-even;
    factor = 1 / quant) per (token, group) -- each group's exact integer partial rounded to FP32, scaled, summed
    in group order -- or per token (``rows="token"``: one partial over every group), the channel scale, one BF16
    rounding. The one implementation of both projections (and of the defects that swap their choices)."""
    from kernels.v4.mtp import int8_matmul, quantize_rows_int8

    tokens, groups = heads.shape[0], config.o_groups
    x = heads.reshape(tokens, groups, -1).to(torch.float64)
    lat = torch.einsum("tgk,gnk->tgn", x, wo_a.to(torch.float64)).to(torch.float32)  # [T, G, O_LORA]
    if latent == "bf16":
        lat = lat.to(torch.bfloat16).float()
    if rows == "token":
        codes, factor = quantize_rows_int8(lat.reshape(tokens, -1), scale_max=config.int8_scale_max,
                                           amax_eps=config.int8_amax_eps)
        return (int8_matmul(codes, wo_b) * factor * wo_b_scale.float()).to(torch.bfloat16)
    return (group_partials(lat, wo_b, config=config) * wo_b_scale.float()).to(torch.bfloat16)


def group_partials(lat: torch.Tensor, wo_b: torch.Tensor, *, config) -> torch.Tensor:
    """The latent [T, G, O_LORA] FP32 through one INT8 row per (token, group) and wo_b [D, G·O_LORA]: each group's
    exact integer partial rounded to FP32, times its factor, summed in group order -> [T, D] FP32 (no scale)."""
    from kernels.v4.mtp import int8_matmul, quantize_rows_int8

    codes, factor = quantize_rows_int8(lat, scale_max=config.int8_scale_max, amax_eps=config.int8_amax_eps)
    w = wo_b.reshape(wo_b.shape[0], lat.shape[1], -1)
    out = torch.zeros(lat.shape[0], wo_b.shape[0], dtype=torch.float32)
    for g in range(lat.shape[1]):
        out = out + int8_matmul(codes[:, g], w[:, g]) * factor[:, g]
    return out


@operator(returns="attn_out [T, D] BF16: FP32 grouped latent of the BF16 heads, one INT8 row per (token, group), "
                  "W8A8 wo_b", spec=SPEC)
def v4_heads_projection(heads: torch.Tensor, wo_a: torch.Tensor, wo_b: torch.Tensor, wo_b_scale: torch.Tensor, *,
                        config) -> torch.Tensor:
    """The heads' output projection (module docstring)."""
    check_heads_projection(heads, wo_a, wo_b, wo_b_scale, config=config)
    return project_heads(heads, wo_a, wo_b, wo_b_scale, config=config)


@operator(returns="x_out [T, D] BF16: BF16-staged grouped latent, one INT8 row per token, W8A8 wo_b", spec=SPEC)
def dspark_output_projection(heads: torch.Tensor, wo_a: torch.Tensor, wo_b: torch.Tensor, wo_b_scale: torch.Tensor,
                             *, config) -> torch.Tensor:
    """The drafter's output projection (module docstring)."""
    check_heads_projection(heads, wo_a, wo_b, wo_b_scale, config=config)
    return project_heads(heads, wo_a, wo_b, wo_b_scale, config=config, latent="bf16", rows="token")


def check_heads_projection_partial(heads: torch.Tensor, wo_a: torch.Tensor, wo_b: torch.Tensor,
                                   wo_b_scale: torch.Tensor, *, config) -> None:
    """The caller's side of one rank's share: G_r >= 1 of the model's groups, heads [G_r, T, H/G·hd] BF16 packed by
    group, wo_a [G_r, O_LORA, H/G·hd] BF16, wo_b [D, G_r·O_LORA] INT8, wo_b_scale [D]."""
    h, hd, groups = config.num_attention_heads, config.head_dim, config.o_groups
    lora, d, width = config.o_lora_rank, config.hidden_size, h // groups * hd
    if (heads.ndim != 3 or not 1 <= heads.shape[0] <= groups or heads.shape[2] != width
            or heads.dtype != torch.bfloat16):
        raise ContractInputError("heads", None, f"BF16 [1 .. {groups} groups, T, {width}]",
                                 f"{heads.dtype}{list(heads.shape)}", SPEC)
    local = heads.shape[0]
    for name, t, shape, dtype in (("wo_a", wo_a, (local, lora, width), torch.bfloat16),
                                  ("wo_b", wo_b, (d, local * lora), torch.int8), ("wo_b_scale", wo_b_scale, (d,), None)):
        if tuple(t.shape) != shape or (dtype is not None and t.dtype != dtype):
            raise ContractInputError(name, None, f"{dtype or ''} {list(shape)}".strip(), f"{t.dtype}{list(t.shape)}",
                                     SPEC)


@operator(returns="o_partial [T, D] FP32: one TP rank's groups of the decode projection, scaled, not rounded "
                  "(the ranks' partials sum to the projection)", spec=SPEC)
def v4_heads_projection_partial(heads: torch.Tensor, wo_a: torch.Tensor, wo_b: torch.Tensor,
                                wo_b_scale: torch.Tensor, *, config) -> torch.Tensor:
    """One rank's share of ``v4_heads_projection`` under tensor parallelism (dspark's decode_o_proj.py: after the
    all-to-all each rank holds its G_r output groups of every token): the same FP32 latent and per-(token, group)
    INT8 rows over its groups, their partials summed in group order, times the channel scale, left in FP32 for the
    sum across ranks."""
    check_heads_projection_partial(heads, wo_a, wo_b, wo_b_scale, config=config)
    lat = torch.einsum("gtk,gnk->tgn", heads.double(), wo_a.double()).float()  # [T, G_r, O_LORA]
    return group_partials(lat, wo_b, config=config) * wo_b_scale.float()


# --- the record ----------------------------------------------------------------------------------------------

def heads_inputs(seed: int, config, *, rows: int) -> dict[str, torch.Tensor]:
    """``rows`` rows of heads ~ N(0, 1) in BF16; upstream's fixture's weights: wo_a ~ N(0, 1/fan-in) in BF16, INT8
    wo_b with per-channel scales. Both projections' cases."""
    g = generator(seed)
    h, hd, groups, lora, d = (config.num_attention_heads, config.head_dim, config.o_groups, config.o_lora_rank,
                              config.hidden_size)
    return {"heads": torch.randn(rows, h, hd, generator=g).to(torch.bfloat16),
            "wo_a": (torch.randn(groups, lora, h // groups * hd, generator=g) / (h // groups * hd) ** 0.5)
            .to(torch.bfloat16),
            "wo_b": int8_codes((d, groups * lora), g), "wo_b_scale": torch.rand(d, generator=g) / 127 / 4 + 1e-4}


def _malformed(case: str) -> tuple[BadCall, ...]:
    """The calls both projections from the heads refuse (one shared check, ``check_heads_projection``): heads
    [T, H, hd] BF16, wo_a [G, O_LORA, H/G·hd] BF16, wo_b [D, G·O_LORA] INT8, wo_b_scale [D]."""
    return (BadCall("heads of another head count", case, replaced(heads=lambda i: i["heads"][:, 1:]), "heads"),
            BadCall("FP32 heads", case, replaced(heads=lambda i: i["heads"].float()), "heads"),
            BadCall("wo_a of another rank", case, replaced(wo_a=lambda i: i["wo_a"][:, 1:]), "wo_a"),
            BadCall("a BF16 wo_b", case, replaced(wo_b=lambda i: i["wo_b"].to(torch.bfloat16)), "wo_b"),
            BadCall("wo_b_scale short", case, replaced(wo_b_scale=lambda i: i["wo_b_scale"][1:]), "wo_b_scale"))


_V4_FUSED = tuple(Upstream(f, none="fused into decode_sparse_attn*.py::golden_sparse_attn (v4_attention)")
                  for f in ("deepseek_v4_pro", "deepseek_v4_flash_mtp"))


def _heads_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """A decode step's 8 rows (``heads_inputs``)."""
    return heads_inputs(seed, config, rows=8)


RECORD = Record(
    operator="v4_heads_projection",
    call=lambda fn, i, config: {"attn_out": fn(**i, config=config)},
    outputs={"attn_out": "attn_out_v4"},
    cases=(CaseSpec("v4_heads_projection", "V4's decode output projection from BF16 heads: 8 rows through the FP32 "
                    "grouped latent, one INT8 row per (token, group) and the W8A8 wo_b", _heads_inputs,
                    geometries=("flash-tiny",)),),
    bad_calls=(BadCall("heads of another head dim", "v4_heads_projection",
                       replaced(heads=lambda i: i["heads"][..., 1:]), "heads"),
               *_malformed("v4_heads_projection")),
    bindings=(
        *_V4_FUSED,
        Upstream("deepseek_v4_flash_dspark", golden="decode_o_proj.py::golden_decode_o_proj_tp1",
                 entry="decode_o_proj.py::decode_o_proj_test"),
    ),
)


def _projection_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """14 rows (2 requests x 7 drafts) of heads (``kernels.v4.heads_projection.heads_inputs``)."""
    return heads_inputs(seed, config, rows=14)


_FUSED = "fused into dspark_attention.py::golden_dspark_attention (judged through dspark_attention)"

DSPARK_RECORD = Record(
    operator="dspark_output_projection",
    call=lambda fn, i, config: {"x_out": fn(**i, config=config)},
    outputs={"x_out": "dspark_x_out"},
    cases=(CaseSpec("dspark_output_projection", "dspark's drafter output projection: 14 rows of heads through the "
                    "BF16-staged grouped latent, one INT8 row per token and the W8A8 wo_b",
                    _projection_inputs, geometries=("flash-tiny",)),),
    bad_calls=_malformed("dspark_output_projection"),
    bindings=dspark_only("the drafter's output projection", none=_FUSED),
)


def _partial_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """Rank 0's half of the groups (TP 2) for the 8 rows of a decode step (``heads_inputs`` packed by group)."""
    i = heads_inputs(seed, config, rows=8)
    local, lora = config.o_groups // 2, config.o_lora_rank
    packed = i["heads"].reshape(8, config.o_groups, -1).transpose(0, 1)[:local].contiguous()
    return {"heads": packed, "wo_a": i["wo_a"][:local].contiguous(),
            "wo_b": i["wo_b"][:, : local * lora].contiguous(), "wo_b_scale": i["wo_b_scale"]}


PARTIAL_RECORD = Record(
    operator="v4_heads_projection_partial",
    call=lambda fn, i, config: {"o_partial": fn(**i, config=config)},
    outputs={"o_partial": "fp32_ulps"},
    cases=(CaseSpec("v4_heads_projection_partial", "one TP rank's share of the decode output projection: rank 0's "
                    "half of the groups for a decode step's 8 rows, FP32 partial", _partial_inputs,
                    geometries=("flash-tiny",)),),
    bad_calls=(BadCall("more groups than the model's", "v4_heads_projection_partial",
                       replaced(heads=lambda i: torch.cat((i["heads"], i["heads"], i["heads"]))), "heads"),),
    bindings=(
        *_V4_FUSED,
        Upstream("deepseek_v4_flash_dspark", golden="decode_o_proj.py::golden_decode_o_proj",
                 entry="decode_o_proj.py::decode_o_proj_test"),
    ),
)
