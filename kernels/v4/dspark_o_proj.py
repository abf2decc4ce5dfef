"""V4-Flash dspark's drafter output projection (spec §8; upstream models/deepseek_v4_flash_dspark/dspark_attention.py,
fused into ``golden_dspark_attention`` and its kernel): the drafter attention's heads to the hidden width.

heads [T, H, hd] BF16 (the attention's heads after the inverse RoPE, ``v4_attention_heads``), ``wo_a`` [G, O_LORA,
H/G·hd] BF16, ``wo_b`` [D, G·O_LORA] INT8, ``wo_b_scale`` [D] FP32:

1. latent[t, g] = heads of group g · wo_a[g]ᵀ (BF16 operands, FP32 accumulation: here FP64 rounded once to FP32),
   **rounded to BF16**;
2. one INT8 row per token over all G·O_LORA latents: quant = 127 / max(amax, eps) (a true division), codes =
   round-half-even(latent · quant), factor = 1 / quant;
3. x_out = BF16((codes · wo_bᵀ, exact integers, rounded to FP32) · factor · wo_b_scale).

This is **not** V4's decode output projection (``v4_output_projection``: an FP32 latent, one INT8 row per (token,
group), group partials summed), which dspark's own decode_o_proj.py keeps for the target model: the drafter's
kernel stages the latent in BF16 and quantizes the token's whole latent row at once (disagreement 20 of
docs/upstream.md).
"""

from __future__ import annotations

import torch

from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, Upstream, generator, int8_codes, replaced

SPEC = "§8"


@operator(returns="x_out [T, D] BF16: BF16-staged grouped latent, one INT8 row per token, W8A8 wo_b", spec=SPEC)
def dspark_output_projection(heads: torch.Tensor, wo_a: torch.Tensor, wo_b: torch.Tensor, wo_b_scale: torch.Tensor,
                             *, config) -> torch.Tensor:
    """The drafter's output projection (module docstring)."""
    from kernels.v4.heads_projection import check_heads_projection
    from kernels.v4.mtp import int8_matmul, quantize_rows_int8

    check_heads_projection(heads, wo_a, wo_b, wo_b_scale, config=config)
    tokens, groups = heads.shape[0], config.o_groups
    x = heads.reshape(tokens, groups, -1).double()
    latent = torch.einsum("tgk,grk->tgr", x, wo_a.double()).float().to(torch.bfloat16)
    codes, factor = quantize_rows_int8(latent.reshape(tokens, -1).float(), scale_max=config.int8_scale_max,
                                       amax_eps=config.int8_amax_eps)
    return (int8_matmul(codes, wo_b) * factor * wo_b_scale.float()).to(torch.bfloat16)


# --- the record ----------------------------------------------------------------------------------------------

def _projection_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """14 rows (2 requests x 7 drafts) of heads ~ N(0, 1) in BF16; upstream's fixture's weights: wo_a ~ N(0, 1/fan-in)
    in BF16, INT8 wo_b with per-channel scales."""
    g = generator(seed)
    h, hd, groups, lora, d = (config.num_attention_heads, config.head_dim, config.o_groups, config.o_lora_rank,
                              config.hidden_size)
    return {"heads": torch.randn(14, h, hd, generator=g).to(torch.bfloat16),
            "wo_a": (torch.randn(groups, lora, h // groups * hd, generator=g) / (h // groups * hd) ** 0.5)
            .to(torch.bfloat16),
            "wo_b": int8_codes((d, groups * lora), g), "wo_b_scale": torch.rand(d, generator=g) / 127 / 4 + 1e-4}


_FUSED = "fused into dspark_attention.py::golden_dspark_attention (judged through dspark_attention)"
_DSPARK_ONLY = "the drafter's output projection is dspark's (no module of this folder)"

RECORD = Record(
    operator="dspark_output_projection",
    call=lambda fn, i, config: {"x_out": fn(**i, config=config)},
    outputs={"x_out": "dspark_x_out"},
    cases=(CaseSpec("dspark_output_projection", "dspark's drafter output projection: 14 rows of heads through the "
                    "BF16-staged grouped latent, one INT8 row per token and the W8A8 wo_b",
                    _projection_inputs, geometries=("flash-tiny",)),),
    bad_calls=(
        BadCall("heads of another head count", "dspark_output_projection",
                replaced(heads=lambda i: i["heads"][:, 1:]), "heads"),
        BadCall("a BF16 wo_b", "dspark_output_projection", replaced(wo_b=lambda i: i["wo_b"].to(torch.bfloat16)),
                "wo_b"),
    ),
    bindings=(
        Upstream("deepseek_v4_pro", none=_DSPARK_ONLY),
        Upstream("deepseek_v4_flash_mtp", none=_DSPARK_ONLY),
        Upstream("deepseek_v4_flash_dspark", none=_FUSED),
    ),
)
