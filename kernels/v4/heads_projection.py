"""V4's decode output projection from the attention's heads (spec §8; upstream
models/deepseek_v4_flash_dspark/decode_o_proj.py, ``golden_decode_o_proj_tp1``): where dspark's decode attention
goldens stop (``v4_attention_heads``, the heads inversely rotated and rounded to BF16), its output projection
starts.

heads [T, H, hd] BF16, ``wo_a`` [G, O_LORA, H/G·hd] BF16, ``wo_b`` [D, G·O_LORA] INT8, ``wo_b_scale`` [D] FP32:
the grouped latent kept in FP32 (BF16 operands; here an FP64 sum rounded once), one INT8 row per (token, group)
(quant = 127 / amax, a true division; codes round-half-even; factor = 1 / quant), each group's exact integer
partial rounded to FP32 and scaled, the partials summed in group order, the channel scale, one BF16 rounding.
``v4_output_projection`` is this after ``output_heads`` (kernels.v4.sparse_attention.grouped_projection, one
implementation). Not the drafter's projection (``dspark_output_projection``: a BF16 latent, one row per token).
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, Upstream, generator, int8_codes, replaced

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


@operator(returns="attn_out [T, D] BF16: FP32 grouped latent of the BF16 heads, one INT8 row per (token, group), "
                  "W8A8 wo_b", spec=SPEC)
def v4_heads_projection(heads: torch.Tensor, wo_a: torch.Tensor, wo_b: torch.Tensor, wo_b_scale: torch.Tensor, *,
                        config) -> torch.Tensor:
    """The heads' output projection (module docstring)."""
    from kernels.v4.sparse_attention import grouped_projection

    check_heads_projection(heads, wo_a, wo_b, wo_b_scale, config=config)
    return grouped_projection(heads, wo_a, wo_b, wo_b_scale, config=config)


# --- the record ----------------------------------------------------------------------------------------------

def _heads_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """A decode step's 8 rows of heads ~ N(0, 1) in BF16; wo_a ~ N(0, 1/fan-in) in BF16, INT8 wo_b with
    per-channel scales (upstream's fixture)."""
    g = generator(seed)
    h, hd, groups, lora, d = (config.num_attention_heads, config.head_dim, config.o_groups, config.o_lora_rank,
                              config.hidden_size)
    return {"heads": torch.randn(8, h, hd, generator=g).to(torch.bfloat16),
            "wo_a": (torch.randn(groups, lora, h // groups * hd, generator=g) / (h // groups * hd) ** 0.5)
            .to(torch.bfloat16),
            "wo_b": int8_codes((d, groups * lora), g), "wo_b_scale": torch.rand(d, generator=g) / 127 / 4 + 1e-4}


RECORD = Record(
    operator="v4_heads_projection",
    call=lambda fn, i, config: {"attn_out": fn(**i, config=config)},
    outputs={"attn_out": "attn_out_v4"},
    cases=(CaseSpec("v4_heads_projection", "V4's decode output projection from BF16 heads: 8 rows through the FP32 "
                    "grouped latent, one INT8 row per (token, group) and the W8A8 wo_b", _heads_inputs,
                    geometries=("flash-tiny",)),),
    bad_calls=(
        BadCall("heads of another head dim", "v4_heads_projection", replaced(heads=lambda i: i["heads"][..., 1:]),
                "heads"),
        BadCall("wo_a of another rank", "v4_heads_projection", replaced(wo_a=lambda i: i["wo_a"][:, 1:]), "wo_a"),
    ),
    bindings=(
        Upstream("deepseek_v4_pro", none="fused into decode_sparse_attn*.py::golden_sparse_attn (v4_attention)"),
        Upstream("deepseek_v4_flash_mtp", none="fused into decode_sparse_attn*.py::golden_sparse_attn (v4_attention)"),
        Upstream("deepseek_v4_flash_dspark", golden="decode_o_proj.py::golden_decode_o_proj_tp1",
                 entry="decode_o_proj.py::decode_o_proj_test"),
    ),
)
