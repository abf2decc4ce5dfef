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

``causal_encoder`` chains the Blocks of layers 0..19 as the decode causal encoder does (see its doc).

Spec: §1 (the layer), upstream_checks HC-03, HC-04, HC-05, HC-12, MO-14.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

import torch

from kernels.config import FLASH_TINY, LayerKind, V41Config
from kernels.errors import ContractInputError
from kernels.operators import operator

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


@operator(returns='{x_hc, next_pre_mix, attention_input, ffn_input, attention_hidden, ffn_output}: '
                   'one decode Block (attention + MoE through mHC with the delayed pre-mix), '
                   "composed from this backend's operators",
          spec='§1')
def decode_block(x_hc: torch.Tensor, incoming_pre_mix: torch.Tensor, attention_inputs: Tensors,
                 attention_mhc: MhcWeights, ffn_mhc: MhcWeights, router: torch.Tensor, bias: torch.Tensor,
                 experts, shared, *, kind: LayerKind | str, tp: int, config: V41Config = FLASH_TINY,
                 ops: Mapping[str, Callable] | None = None) -> Tensors:
    """One decode Block. Returns ``x_hc`` (the Block's output streams, FP32), ``next_pre_mix`` (the FFN pre
    mix handed on), the two sublayer inputs, ``attention_hidden`` and ``ffn_output`` (the MoE's BF16 rows the
    FFN expansion takes); the caches the attention updates are the half-layer's, judged by its own trees.
    Spec: HC-03, HC-04, HC-05."""
    result, _attention = _block(x_hc, incoming_pre_mix, attention_inputs, attention_mhc, ffn_mhc, router, bias,
                                experts, shared, kind=kind, tp=tp, config=config, ops=ops)
    return result


def _block(x_hc: torch.Tensor, incoming_pre_mix: torch.Tensor, attention_inputs: Tensors,
           attention_mhc: MhcWeights, ffn_mhc: MhcWeights, router: torch.Tensor, bias: torch.Tensor, experts,
           shared, *, kind: LayerKind | str, tp: int, config: V41Config,
           ops: Mapping[str, Callable] | None) -> tuple[Tensors, Tensors]:
    """decode_block, also handing back the attention half-layer's own outputs (its caches and Top-K)."""
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
    return ({"x_hc": x_out, "next_pre_mix": ffn.pre, "attention_input": attention_input, "ffn_input": ffn_input,
             "attention_hidden": attention_hidden, "ffn_output": moe_out}, out)


decode_block.composes_operators = True  # a backend binds ``ops`` to its own operators (contracts.operators.Backend.get)

@operator(returns="decode_block's outputs as owner slabs (padding rows zero) plus gathered [T,D]: "
                   "the sharded wiring, composed from this backend's operators",
          spec='§1')
def decode_block_sharded(x_hc: torch.Tensor, incoming_pre_mix: torch.Tensor, attention_inputs: Tensors,
                         attention_mhc: MhcWeights, ffn_mhc: MhcWeights, router: torch.Tensor, bias: torch.Tensor,
                         experts, shared, *, kind: LayerKind | str, tp: int, config: V41Config = FLASH_TINY,
                         ops: Mapping[str, Callable] | None = None) -> Tensors:
    """The decode Block in the sharded (sequence-parallel) wiring: ``x_hc`` [tp, W, hc, D] and
    ``incoming_pre_mix`` [tp, W, hc] are owner slabs (rank r holds active rows [r·W, r·W + count) of the batch,
    W = ceil(capacity / tp), the rest zero; the capacity may exceed the active rows, as TP padding does). Every mHC step runs on each rank's own rows; the attention takes the
    collapsed slabs in its sharded wiring (it all-gathers them) and returns output slabs; the MoE runs on the
    rank's rows. Every output is a slab of the same bounds with exact zeros on padding rows -- the next layer
    consumes it as it is, without a re-split. A padding row that is not zero on input is refused naming rank
    and row. Spec: upstream_checks MD-27, SP-14, SP-07, HC-03, HC-04."""
    from kernels.sequence_parallel import sp_bounds

    o = {**_reference_ops(), **(ops or {})}
    tokens = int(attention_inputs["position_ids"].shape[0])
    active = int(attention_inputs["num_tokens"])
    bounds = sp_bounds(active, tp, tokens)
    width, hc, d = bounds[0].width, config.hc_mult, config.hidden_size
    if x_hc.shape != (tp, width, hc, d) or x_hc.dtype != torch.float32 or incoming_pre_mix.shape != (tp, width, hc):
        raise ContractInputError("x_hc", None, f"FP32 owner slabs [{tp}, {width}, {hc}, {d}] with pre-mix slabs "
                                 f"[{tp}, {width}, {hc}]", [f"{x_hc.dtype}{list(x_hc.shape)}",
                                                            list(incoming_pre_mix.shape)], "MD-27")
    for name, slabs in (("x_hc", x_hc), ("incoming_pre_mix", incoming_pre_mix)):
        for b in bounds:
            dirty = (slabs[b.rank, b.count:] != 0).flatten(1).any(1)
            if bool(dirty.any()):
                raise ContractInputError(name, (b.rank, b.count + int(dirty.nonzero()[0, 0])),
                                         "0 (a padding row of the owner slab)", "non-zero", "MD-27")
    attention_input = torch.zeros(tp, width, d, dtype=torch.bfloat16)
    mixes = []
    for b in bounds:
        if b.count == 0:  # a rank without rows runs no mHC step
            mixes.append(None)
            continue
        rows = x_hc[b.rank, :b.count]
        mixes.append(o["hc_mixes"](rows, attention_mhc.function, attention_mhc.scale, attention_mhc.base,
                                   config=config))
        attention_input[b.rank, :b.count] = o["hc_pre"](rows, incoming_pre_mix[b.rank, :b.count])
    attention = o["attention_half_layer"]
    if getattr(attention, "composes_operators", False):
        attention = partial(attention, ops=o)
    out = attention({**attention_inputs, "x": attention_input}, kind=kind, phase="decode", wiring="sharded", tp=tp,
                    config=config)
    result = {"x_hc": torch.zeros_like(x_hc), "next_pre_mix": torch.zeros_like(incoming_pre_mix),
              "attention_input": attention_input, "ffn_input": torch.zeros(tp, width, d, dtype=torch.bfloat16),
              "attention_hidden": torch.zeros_like(x_hc), "ffn_output": torch.zeros(tp, width, d, dtype=torch.bfloat16)}
    for b, attn in zip(bounds, mixes, strict=True):
        r, n = b.rank, b.count
        if attn is None:
            continue
        hidden = o["hc_post"](out["output"][r, :n], x_hc[r, :n], attn.post, attn.residual)
        ffn = o["hc_mixes"](hidden, ffn_mhc.function, ffn_mhc.scale, ffn_mhc.base, config=config)
        ffn_input = o["hc_pre"](hidden, attn.pre)
        moe_out = moe_dense(ffn_input, router, bias, experts, shared, config=config, ops=o)
        result["x_hc"][r, :n] = o["hc_post"](moe_out, hidden, ffn.post, ffn.residual)
        result["next_pre_mix"][r, :n] = ffn.pre
        result["ffn_input"][r, :n] = ffn_input
        result["attention_hidden"][r, :n] = hidden
        result["ffn_output"][r, :n] = moe_out
    result["gathered"] = out["gathered"]
    return result


decode_block_sharded.composes_operators = True

# What a REUSE layer takes from its KV source: the compressed cache the source published and its Top-K rows.
REUSED = ("compressed_payload", "compressed_scale", "topk_indices")


@operator(returns='{x_hc, next_pre_mix, layer_x_hc [L,T,hc,D], layer_pre_mix [L,T,hc], reused_from '
                   '[L]}: the decode Blocks of layers 0..19 chained, REUSE layers reading their '
                   "source's published cache and Top-K, composed from this backend's operators",
          spec='§1')
def causal_encoder(x_hc: torch.Tensor, layer_inputs: Mapping[LayerKind, Tensors], attention_mhc: MhcWeights,
                   ffn_mhc: MhcWeights, router: torch.Tensor, bias: torch.Tensor, experts, shared, *, tp: int,
                   config: V41Config = FLASH_TINY, layers: int | None = None,
                   ops: Mapping[str, Callable] | None = None) -> Tensors:
    """The decode causal encoder: the Blocks of layers 0 .. candidate source - 1 (0..19) in order. Layer 0
    starts from the one-hot lane-0 mix and every later layer takes the previous Block's ``next_pre_mix``; each
    layer runs the attention kind of the schedule with ``layer_inputs[kind]`` (its weights, metadata and its own
    window cache), except that a REUSE layer reads the compressed cache and Top-K rows its KV source layer
    published in this run (layers 3-7 from 2, 9-13 from 8, 15-19 from 14). ``layers`` stops early (a prefix of
    the chain). Returns the final ``x_hc`` and ``next_pre_mix``, ``layer_x_hc`` [L, T, hc, D] after every layer,
    ``layer_pre_mix`` [L, T, hc] handed on by every layer, and ``reused_from`` [L] (the source each layer's
    compressed cache came from, -1 for SWA and FULL). Spec: upstream_checks HC-05, HC-12."""
    from kernels.reference.mhc import identity_pre_mix

    o = {**_reference_ops(), **(ops or {})}
    count = config.candidate_source_layer_id if layers is None else layers
    if isinstance(count, bool) or not 1 <= count <= config.candidate_source_layer_id:
        raise ContractInputError("layers", None, f"1..{config.candidate_source_layer_id}", count, "HC-12")
    mix = identity_pre_mix(x_hc)
    published: dict[int, Tensors] = {}
    xs, mixes, sources = [], [], []
    for layer_id in range(count):
        layer = config.schedule[layer_id]
        inputs = dict(layer_inputs[layer.kind])
        source = -1
        if layer.kind is LayerKind.C2A_REUSE:
            source = layer.kv_source
            if source not in published:
                raise ContractInputError("kv_source", (layer_id,), f"layer {source} run before layer {layer_id}",
                                         "not run", "HC-12")
            inputs.update(published[source])
        result, attention = _block(x_hc, mix, inputs, attention_mhc, ffn_mhc, router, bias, experts, shared,
                                   kind=layer.kind, tp=tp, config=config, ops=o)
        if layer.kind is LayerKind.C2A_FULL:
            published[layer_id] = {name: attention[name] for name in REUSED}
        x_hc, mix = result["x_hc"], result["next_pre_mix"]
        xs.append(x_hc)
        mixes.append(mix)
        sources.append(source)
    return {"x_hc": x_hc, "next_pre_mix": mix, "layer_x_hc": torch.stack(xs), "layer_pre_mix": torch.stack(mixes),
            "reused_from": torch.tensor(sources, dtype=torch.int32)}


causal_encoder.composes_operators = True
