"""The decode Block of a V4.1 layer: attention and the MoE FFN, each between an mHC collapse and expansion,
with the delayed pre-mix hand-off.

For the four streams ``x_hc`` [T, hc, D] (FP32) and the incoming pre mix [T, hc] (the previous Block's FFN pre
mix; the one-hot lane-0 mix for the first layer):

1. ``attn = hc_mixes(x_hc, attention mHC weights)``;
2. the attention input is ``hc_pre(x_hc, incoming)`` -- the **incoming** mix, not ``attn.pre`` -- as BF16;
3. the attention half-layer runs (replicated wiring; every rank holds the same output rows) and
   ``attention_hidden = hc_post(attention output, x_hc, attn.post, attn.residual)``;
4. ``ffn = hc_mixes(attention_hidden, FFN mHC weights)``;
5. the FFN input is ``hc_pre(attention_hidden, attn.pre)`` -- the **attention's** pre mix, one sublayer late;
6. the MoE (the compact single-rank form, ``moe_dense``) runs and ``x_out = hc_post(moe output,
   attention_hidden, ffn.post, ffn.residual)``;
7. the Block hands on ``ffn.pre`` as the next Block's incoming mix.

A Block golden needs every capacity row active: a call with fewer active tokens than rows is refused.

Every primitive is taken from ``ops`` (operator name -> callable, defaulting to the Torch references), so a
backend that replaces one (a seeded defect, a device kernel) is judged through the whole Block.

Spec: §1 (the layer), upstream_checks HC-03, HC-04, HC-05, MO-14.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

import torch

from kernels.config import FLASH_TINY, LayerKind, V41Config
from kernels.errors import ContractInputError

SPEC = "§1"
ROUNDING_VERSION = "block-1"
Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class MhcWeights:
    function: torch.Tensor
    scale: torch.Tensor
    base: torch.Tensor


def _reference_ops() -> dict[str, Callable]:
    from kernels.reference import attention_layer, mhc, moe

    return {"hc_mixes": mhc.hc_mixes, "hc_pre": mhc.hc_pre, "hc_post": mhc.hc_post, "moe_gate": moe.moe_gate,
            "moe_expert": moe.moe_expert, "attention_half_layer": attention_layer.attention_half_layer}


def moe_dense(x: torch.Tensor, router: torch.Tensor, bias: torch.Tensor, experts, shared, *,
              config: V41Config = FLASH_TINY, ops: Mapping[str, Callable] | None = None) -> torch.Tensor:
    """The compact single-rank MoE of a Block golden (no EP transport): shared + Σ_k routed in FP32, one BF16
    cast, for every row. Spec: MO-14, MO-09."""
    o = {**_reference_ops(), **(ops or {})}
    weights, ids = o["moe_gate"](x, router, bias, config=config)
    total = o["moe_expert"](x, shared, None, config=config)
    for k in range(ids.shape[1]):
        rows = [o["moe_expert"](x[t:t + 1], experts[int(ids[t, k])], weights[t, k:k + 1], config=config)[0]
                for t in range(x.shape[0])]
        total = total + torch.stack(rows)
    return total.to(torch.bfloat16)


def decode_block(x_hc: torch.Tensor, incoming_pre_mix: torch.Tensor, attention_inputs: Tensors,
                 attention_mhc: MhcWeights, ffn_mhc: MhcWeights, router: torch.Tensor, bias: torch.Tensor,
                 experts, shared, *, kind: LayerKind | str, tp: int, config: V41Config = FLASH_TINY,
                 ops: Mapping[str, Callable] | None = None) -> Tensors:
    """One decode Block. Returns ``x_hc`` (the Block's output streams, FP32), ``next_pre_mix`` (the FFN pre
    mix handed on), the two sublayer inputs, ``attention_hidden`` and ``ffn_output`` (the MoE's BF16 rows the
    FFN expansion takes); the caches the attention updates are the half-layer's, judged by its own trees.
    Spec: HC-03, HC-04, HC-05."""
    o = {**_reference_ops(), **(ops or {})}
    tokens = x_hc.shape[0]
    if x_hc.ndim != 3 or x_hc.dtype != torch.float32:
        raise ContractInputError("x_hc", None, "FP32 [T, hc, D]", f"{x_hc.dtype}{list(x_hc.shape)}", SPEC)
    active = int(attention_inputs["num_tokens"])
    if active != tokens:
        raise ContractInputError("num_tokens", None, f"{tokens}: a Block golden needs every capacity row active",
                                 active, "HC-05")
    attn = o["hc_mixes"](x_hc, attention_mhc.function, attention_mhc.scale, attention_mhc.base, config=config)
    attention_input = o["hc_pre"](x_hc, incoming_pre_mix)
    attention = o["attention_half_layer"]
    if getattr(attention, "composes_operators", False):  # the half-layer composes this backend's operators too
        attention = partial(attention, ops=o)
    out = attention({**attention_inputs, "x": attention_input}, kind=kind, phase="decode", wiring="replicated", tp=tp,
                    config=config)
    attention_hidden = o["hc_post"](out["output"][0], x_hc, attn.post, attn.residual)
    ffn = o["hc_mixes"](attention_hidden, ffn_mhc.function, ffn_mhc.scale, ffn_mhc.base, config=config)
    ffn_input = o["hc_pre"](attention_hidden, attn.pre)
    moe_out = moe_dense(ffn_input, router, bias, experts, shared, config=config, ops=o)
    x_out = o["hc_post"](moe_out, attention_hidden, ffn.post, ffn.residual)
    return {"x_hc": x_out, "next_pre_mix": ffn.pre, "attention_input": attention_input, "ffn_input": ffn_input,
            "attention_hidden": attention_hidden, "ffn_output": moe_out}


decode_block.composes_operators = True  # a backend binds ``ops`` to its own operators (contracts.backends)
