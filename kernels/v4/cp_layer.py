"""V4-Flash's context-parallel prefill of one whole layer (spec §7.1, §8; upstream
models/deepseek_v4_flash_mtp/prefill_cp_layer.py), composed:

    each rank's zigzag tiles x_hc [cp, 2, 2, R, hc, D] FP32
    -> the layer's CP attention sublayer, by its compress ratio: ``prefill_cp_swa`` (0), ``prefill_cp_csa`` (4) or
       ``prefill_cp_hca`` (128)
    -> ``v4_moe_stage`` on every tile that holds a query row (its ``num_tokens`` the tile's rows; the tile's token
       ids ``input_ids`` [cp, 2, 2, R] route a hash layer)
    -> x_next [cp, 2, 2, R, hc, D] FP32 (0 on rows without a query), with the sublayer's caches and states.

A token's MoE is its own (routing and experts are per token), so which rank computes it moves no byte; upstream's
golden runs the MoE as "waves" (one per (part, tile)) over the CP ranks as EP ranks, which needs every rank's
wave to hold as many rows (its fixture's equal segments).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from kernels.errors import ContractInputError, is_int
from kernels.operators import operator
from kernels.v4.cp_swa import _bound, active_tiles

SPEC = "§7.1"
KINDS = {0: "prefill_cp_swa", 4: "prefill_cp_csa", 128: "prefill_cp_hca"}  # compress ratio -> CP sublayer


def check_prefill_cp_layer(x_hc: torch.Tensor, moe: Mapping, compressor, *, layer_id, config,
                           query_staging: str = "bf16") -> str:
    """The layer's own arguments (its sublayer and stage check theirs) -> the sublayer operator's name."""
    ratios = config.compress_ratios[:config.num_hidden_layers]
    if not is_int(layer_id) or not 0 <= layer_id < len(ratios) or ratios[layer_id] not in KINDS:
        raise ContractInputError("layer_id", None, f"a main layer of the model (0 .. {len(ratios) - 1})",
                                 repr(layer_id), SPEC)
    kind = KINDS[ratios[layer_id]]
    if {"x_hc", "num_tokens", "layer_id"} & set(moe):
        raise ContractInputError("moe", None, "the MoE stage's arguments without x_hc, num_tokens and layer_id",
                                 sorted({"x_hc", "num_tokens", "layer_id"} & set(moe)), SPEC)
    ids = moe.get("input_ids")
    if ids is None or tuple(ids.shape) != tuple(x_hc.shape[:4]) or ids.is_floating_point():
        raise ContractInputError("moe.input_ids", None, f"{list(x_hc.shape[:4])} integers (a token id per query row)",
                                 "missing" if ids is None else f"{ids.dtype}{list(ids.shape)}", SPEC)
    if query_staging != "bf16" and kind != "prefill_cp_csa":
        raise ContractInputError("query_staging", None, f"the CSA indexer's rule: layer {layer_id} is {kind}'s "
                                 "(no indexer)", repr(query_staging), SPEC)
    if kind != "prefill_cp_swa" and compressor is None:
        raise ContractInputError("compressor", None, f"the {kind} sublayer's compressor pools and weights (layer "
                                 f"{layer_id}, compress ratio {ratios[layer_id]})", None, SPEC)
    return kind


@operator(returns="{x_next [cp,2,2,R,hc,D] FP32, kv_cache (+ the sublayer's caches and states)}: one layer's CP "
                  "prefill -- the layer's CP attention sublayer (SWA, CSA or HCA by its compress ratio), then "
                  "v4_moe_stage on every tile holding a query row", spec=SPEC)
def prefill_cp_layer(x_hc: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                     attn_norm_w: torch.Tensor, wq_a: torch.Tensor, wq_b: torch.Tensor, wq_b_scale: torch.Tensor,
                     wkv: torch.Tensor, gamma_cq: torch.Tensor, gamma_ckv: torch.Tensor, freqs_cos: torch.Tensor,
                     freqs_sin: torch.Tensor, kv_cache: torch.Tensor, attn_sink: torch.Tensor, wo_a: torch.Tensor,
                     wo_b: torch.Tensor, wo_b_scale: torch.Tensor, moe: Mapping, compressor: Mapping | None,
                     plan: Mapping[str, torch.Tensor], *, layer_id: int, config, ops=None,
                     query_staging: str = "bf16") -> dict[str, torch.Tensor]:
    """The CP prefill of layer ``layer_id`` (module docstring): the sublayer's arguments as ``prefill_cp_hca`` /
    ``prefill_cp_csa`` take them (``compressor`` None for an SWA layer; ``plan`` ``cp_hca_plan``'s tables, of which
    SWA reads its own), ``moe`` the MoE stage's arguments with ``input_ids`` [cp, 2, 2, R], without x_hc,
    num_tokens and layer_id; ``query_staging``: the CSA indexer's named rules -> {"x_next", and the sublayer's
    outputs but its x_out}. No input is modified."""
    from kernels.v4.cp_csa import prefill_cp_csa
    from kernels.v4.cp_hca import prefill_cp_hca
    from kernels.v4.cp_swa import prefill_cp_swa
    from kernels.v4.moe import v4_moe_stage

    ops = ops or {}
    kind = check_prefill_cp_layer(x_hc, moe, compressor, layer_id=layer_id, config=config,
                                  query_staging=query_staging)
    args = (x_hc, hc_fn, hc_scale, hc_base, attn_norm_w, wq_a, wq_b, wq_b_scale, wkv, gamma_cq, gamma_ckv, freqs_cos,
            freqs_sin, kv_cache, attn_sink, wo_a, wo_b, wo_b_scale)
    sublayer = _bound(ops, kind, {"prefill_cp_swa": prefill_cp_swa, "prefill_cp_hca": prefill_cp_hca,
                                  "prefill_cp_csa": prefill_cp_csa}[kind])
    if kind == "prefill_cp_swa":
        att = sublayer(*args, plan, config=config)
    else:
        att = sublayer(*args, compressor, plan, config=config,
                       **({"query_staging": query_staging} if query_staging != "bf16" else {}))
    stage = _bound(ops, "v4_moe_stage", v4_moe_stage)
    active = plan["overlay_active_lengths"][..., 1]
    x_next = torch.zeros_like(x_hc)
    for rank, part, tile in active_tiles(plan):
        n = int(active[rank, part, tile])
        out = stage(att["x_out"][rank, part, tile], **{**moe, "input_ids": moe["input_ids"][rank, part, tile]},
                    layer_id=layer_id, num_tokens=n, config=config)
        x_next[rank, part, tile, :n] = out["x_out"][:n]
    return {"x_next": x_next, **{k: v for k, v in att.items() if k != "x_out"}}


prefill_cp_layer.composes_operators = True
