"""The attention output projection of one rank: inverse RoPE, grouped Wo-A, then Wo-B to an FP32 partial.

``attended`` [T, H, D] BF16 (the heads of this rank) gets the inverse adjacent-pair rotation on the last
``2 * cos.shape[-1]`` dims of every head (the token RoPE profile at the token positions), rounded back to
BF16. Heads are then cut into ``G`` groups of ``H*D/G`` inputs; group g is multiplied by its own
``wo_a[g]`` [O_LORA, H*D/G] (BF16) with FP32 accumulation and one BF16 rounding, giving the latent
[T, G*O_LORA]; the latent times ``wo_b`` [G*O_LORA, hidden] accumulates in FP32 into the rank's partial,
which stays FP32 for the TP reduction (``kernels.reference.tp``).

The device's Wo-B is MXFP8 (E4M3 payload, E8M0 scale per 32 input rows, stored MX_B_NN); this reference takes
the decoded weight values instead (any float dtype), so the MX decode is not part of it.

Spec: §1 (o_groups, O_GROUP_IN), §7.1 (FP32 partials); upstream_checks RR-12, AP-09 (inverse rope, BF16
grouped wo_a, FP32 wo_b partial), AP-10 (FP32 accumulate, one BF16 cast).
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.reference.rope import rope_interleave

SPEC = "§7.1"
ROUNDING_VERSION = "oproj-1"


@operator(returns='[T, hidden] FP32 partial (inverse RoPE, grouped Wo-A with one BF16 rounding, '
                   'Wo-B in FP32)',
          spec='§7.1')
def o_proj(attended: torch.Tensor, rope_cos: torch.Tensor, rope_sin: torch.Tensor, wo_a: torch.Tensor,
                      wo_b: torch.Tensor) -> torch.Tensor:
    """[T, H, D] BF16 -> [T, hidden] FP32 partial. ``rope_cos``/``rope_sin`` [T, R/2] FP32; ``wo_a`` [G, O, H*D/G]
    BF16; ``wo_b`` [G*O, hidden] (decoded values). Spec: §7.1, AP-09."""
    if attended.ndim != 3 or attended.dtype != torch.bfloat16:
        raise ContractInputError("attended", None, "BF16 [T, H, D]", f"{attended.dtype}{list(attended.shape)}", SPEC)
    tokens, heads, dim = attended.shape
    half = rope_cos.shape[-1] if rope_cos.ndim == 2 else -1
    for name, table in (("rope_cos", rope_cos), ("rope_sin", rope_sin)):
        if table.ndim != 2 or table.shape[0] != tokens or table.shape[1] != half or 2 * half > dim:
            raise ContractInputError(name, None, f"[{tokens}, R/2] with R <= {dim}", list(table.shape), SPEC)
    if wo_a.ndim != 3 or (heads * dim) % wo_a.shape[0] or wo_a.shape[2] != heads * dim // wo_a.shape[0]:
        raise ContractInputError("wo_a", None, f"[G, O_LORA, {heads}*{dim}/G]", list(wo_a.shape), SPEC)
    groups, lora, group_in = wo_a.shape
    if wo_b.ndim != 2 or wo_b.shape[0] != groups * lora:
        raise ContractInputError("wo_b", None, f"[{groups}*{lora}, hidden]", list(wo_b.shape), SPEC)
    unrotated = rope_interleave(attended, rope_cos.unsqueeze(1), rope_sin.unsqueeze(1), inverse=True)
    x = unrotated.reshape(tokens, groups, group_in).to(torch.float64)
    latent = torch.einsum("tgk,gnk->tgn", x, wo_a.to(torch.float64)).to(torch.float32).to(torch.bfloat16)
    partial = latent.reshape(tokens, groups * lora).to(torch.float64) @ wo_b.to(torch.float64)
    return partial.to(torch.float32)
