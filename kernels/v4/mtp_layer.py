"""V4's MTP layer at decode (spec §8; upstream decode_mtp.py), end to end:

    current hidden + previous pre-hc hidden -> mtp_projection -> the SWA attention stage -> the MoE stage
    -> next pre-hc hidden -> hc_head (its own head mix) -> RMSNorm (mtp_norm_w) -> hidden out

* ``v4_head_mix``: the head's collapse weights pre [T, hc] = sigmoid(logit · scale + base) + hc_eps with
  logit = (x_flat · fn[h]) · inv_rms(x_flat) over the hc·D stream row (FP32; the pre part of ``hc_mixes``
  with the head's own fn [hc, hc·D], scale [1], base [hc]);
* the head collapses the streams with it (``hc_head``: Σ_h pre_h · x_h in FP32, one BF16 rounding) and
  ``final_norm`` normalises with ``mtp_norm_w`` (FP32, one BF16 rounding);
* the next draft step receives the MoE stage's streams (FP32 [T, hc, D]), not the normalised output.

The MoE stage routes the MTP layer by score (its layer id is num_hidden_layers, past the hash layers).

``v4_prefill_mtp_layer`` is the same chain on one request's prefill chunk (upstream prefill_mtp.py): T rows,
``num_tokens`` of them real. Its SWA stage lowers its window from the chunk's positions and 1-D page table
(``v4_prefill_swa_indices``), rotates with **profile 0** of the two-profile RoPE tables [2, positions, rope]
(the sliding-window profile; profile 1 is the compressors'), and runs in its prefill form (padding rows write
no kv row and leave x_out 0); the MoE stage gets the same ``num_tokens``, so padding rows route nowhere, and
hidden_out / next_pre_hc_hidden are exactly 0 there.
Composed from the backend's operators. Spec: §8; docs/coverage.md, V4 section (V4-15).
"""

from __future__ import annotations

from functools import partial

import torch

from kernels.errors import ContractInputError, is_int
from kernels.operators import operator
from kernels.record import BadCall, CaseSpec, Record, generator, in_all_folders, replaced

SPEC = "§8"
ROUNDING_VERSION = "v4-mtp-layer-1"


@operator(returns="pre [T, hc] FP32: the head's collapse weights, sigmoid(logit · scale + base) + "
                   'hc_eps',
          spec='§8')
def v4_head_mix(x_hc: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
                config) -> torch.Tensor:
    """x_hc [T, hc, D] FP32, fn [hc, hc·D], scale [1], base [hc] -> pre [T, hc] FP32. Spec: §8."""
    from kernels.reference.rowwise import rowwise_matmul

    hc = config.hc_mult
    if x_hc.ndim != 3 or x_hc.shape[1] != hc:
        raise ContractInputError("x_hc", None, f"[T, {hc}, D]", list(x_hc.shape), SPEC)
    tokens, _, dim = x_hc.shape
    if fn.shape != (hc, hc * dim) or scale.shape != (1,) or base.shape != (hc,):
        raise ContractInputError("head fn/scale/base", None, f"[{hc}, {hc * dim}] / [1] / [{hc}]",
                                 [list(fn.shape), list(scale.shape), list(base.shape)], SPEC)
    flat = x_hc.reshape(tokens, hc * dim).float()
    inverse_rms = torch.rsqrt(flat.square().mean(dim=-1, keepdim=True) + config.rms_norm_eps)
    logits = rowwise_matmul(flat, fn) * inverse_rms
    return torch.sigmoid(logits * scale.float()[0] + base.float()) + config.hc_eps


@operator(returns="{y [T, D] BF16}: v4_head_mix then hc_head in one call (upstream's hc_head goldens and entries)",
          spec="§8")
def hc_head_fused(x_hc: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *, config,
                  ops=None) -> dict[str, torch.Tensor]:
    """The final collapse as upstream's hc_head.py computes it: the head's pre mix and the collapse, one call (the
    mix itself is not an output). Spec: §8, HC-02."""
    from kernels.reference.mhc import hc_head

    ops = ops or {}
    pre = ops.get("v4_head_mix", v4_head_mix)(x_hc, fn, scale, base, config=config)
    return {"y": ops.get("hc_head", hc_head)(x_hc, pre)}


hc_head_fused.composes_operators = True


@operator(returns='{hidden_out [T,D] BF16, next_pre_hc_hidden [T,hc,D] FP32, kv_cache}: the MTP '
                   'layer, composed from mtp_projection, v4_attention_stage (SWA), v4_moe_stage, '
                   'v4_head_mix, hc_head, final_norm',
          spec='§8')
def v4_mtp_layer(hidden: torch.Tensor, prev: torch.Tensor, projection: dict, attention: dict, moe: dict,
                 head: dict, *, config, ops=None) -> dict[str, torch.Tensor]:
    """hidden [T, D] BF16 and prev [T, hc, D] FP32 (the previous step's pre-hc streams); ``projection`` the
    ``mtp_projection`` weights, ``attention`` the SWA stage's arguments (``v4_attention_stage`` by name, without
    x_hc), ``moe`` the MoE stage's (``v4_moe_stage`` by name, without x_hc and layer_id), ``head`` {fn, scale,
    base, norm_w} -> {"hidden_out" [T, D] BF16, "next_pre_hc_hidden" [T, hc, D] FP32, "kv_cache"}.
    Spec: §8."""
    from kernels.v4.attention_stage import v4_attention_stage
    from kernels.v4.moe import v4_moe_stage
    from kernels.v4.mtp import mtp_projection

    _check_head(head)
    bound = _binder(ops or {})
    x = bound("mtp_projection", mtp_projection)(hidden, prev, **projection, config=config)
    att = bound("v4_attention_stage", v4_attention_stage)("SWA", x, **attention, config=config)
    out = bound("v4_moe_stage", v4_moe_stage)(att["x_out"], **moe, layer_id=config.num_hidden_layers, config=config)
    return _head(bound, out["x_out"], head, att["kv_cache"], config)


v4_mtp_layer.composes_operators = True


def _binder(ops: dict):
    def bound(name, default):
        fn = ops.get(name, default)
        return partial(fn, ops=ops) if getattr(fn, "composes_operators", False) else fn
    return bound


def _check_head(head: dict) -> None:
    missing = {"fn", "scale", "base", "norm_w"} - set(head)
    if missing:
        raise ContractInputError("head", None, "fn, scale, base and norm_w", sorted(missing), SPEC)


def _head(bound, x: torch.Tensor, head: dict, kv_cache: torch.Tensor, config) -> dict[str, torch.Tensor]:
    """The MoE stage's streams x -> head mix -> hc_head -> RMSNorm; x itself goes to the next step."""
    from kernels.reference import lm_head, mhc

    pre = bound("v4_head_mix", v4_head_mix)(x, head["fn"], head["scale"], head["base"], config=config)
    hidden_out = bound("final_norm", lm_head.final_norm)(bound("hc_head", mhc.hc_head)(x, pre), head["norm_w"],
                                                         config=config)
    return {"hidden_out": hidden_out, "next_pre_hc_hidden": x, "kv_cache": kv_cache}


def check_prefill_mtp_layer(hidden: torch.Tensor, attention: dict, head: dict, num_tokens: int) -> None:
    """The caller's side of ``v4_prefill_mtp_layer`` that the layer itself checks, before any stage runs: the
    head's weights, num_tokens, the attention's prefill arguments and its two-profile RoPE tables."""
    _check_head(head)
    tokens = hidden.shape[0]
    if not is_int(num_tokens) or not 0 <= num_tokens <= tokens:
        raise ContractInputError("num_tokens", None, f"an int in [0, {tokens}]", repr(num_tokens), SPEC)
    missing = {"block_table", "freqs_cos", "freqs_sin", "position_ids"} - set(attention)
    if missing:
        raise ContractInputError("attention", None, "block_table, freqs_cos, freqs_sin and position_ids",
                                 sorted(missing), SPEC)
    for name in ("freqs_cos", "freqs_sin"):
        table = attention[name]
        if table.ndim != 3 or table.shape[0] != 2:
            raise ContractInputError(name, None, "[2, positions, rope] (profile 0 sliding-window, 1 compressed)",
                                     list(table.shape), SPEC)


@operator(returns="{hidden_out, next_pre_hc_hidden, kv_cache}: the MTP layer on one request's "
                   'prefill chunk, composed from v4_prefill_swa_indices, mtp_projection, '
                   'v4_attention_stage (SWA, prefill form, profile 0), v4_moe_stage, v4_head_mix, '
                   'hc_head, final_norm',
          spec='§8')
def v4_prefill_mtp_layer(hidden: torch.Tensor, prev: torch.Tensor, projection: dict, attention: dict, moe: dict,
                         head: dict, num_tokens: int, *, config, ops=None) -> dict[str, torch.Tensor]:
    """One request's prefill chunk through the MTP layer (module doc): hidden [T, D] BF16, prev [T, hc, D] FP32,
    ``attention`` the SWA stage's arguments with ``block_table`` [pages] in place of ``window_indices`` and the
    two-profile ``freqs_cos`` / ``freqs_sin`` [2, positions, rope]; ``moe`` without num_tokens; ``num_tokens`` the
    real rows -> {"hidden_out", "next_pre_hc_hidden", "kv_cache"} as ``v4_mtp_layer``. Spec: §8."""
    from kernels.v4.attention_stage import v4_attention_stage
    from kernels.v4.decode_metadata import v4_prefill_swa_indices
    from kernels.v4.moe import v4_moe_stage
    from kernels.v4.mtp import mtp_projection

    check_prefill_mtp_layer(hidden, attention, head, num_tokens)
    stage = dict(attention)
    for name in ("freqs_cos", "freqs_sin"):
        stage[name] = stage[name][0]  # the sliding-window profile
    bound = _binder(ops or {})
    stage["window_indices"] = bound("v4_prefill_swa_indices", v4_prefill_swa_indices)(
        stage["position_ids"], stage.pop("block_table"), num_tokens, config=config)
    x = bound("mtp_projection", mtp_projection)(hidden, prev, **projection, config=config)
    att = bound("v4_attention_stage", v4_attention_stage)("SWA", x, **stage, num_tokens=num_tokens, config=config)
    out = bound("v4_moe_stage", v4_moe_stage)(att["x_out"], **moe, layer_id=config.num_hidden_layers,
                                               num_tokens=num_tokens, config=config)
    return _head(bound, out["x_out"], head, att["kv_cache"], config)


v4_prefill_mtp_layer.composes_operators = True


def _hc_head_fused_inputs(seed: int, wiring: str, config) -> dict[str, torch.Tensor]:
    """The decode step's rows of 4 FP32 streams (one 8x larger, one 1/8), a head function ~ N(0, 1/hc·D), scale and
    base ~ N(0, 1): the final collapse on a real head mix."""
    g = generator(seed)
    hc, d, t = config.hc_mult, config.hidden_size, config.decode_tokens
    x = torch.randn(t, hc, d, generator=g)
    x[1] *= 8.0
    x[2] /= 8.0
    return {"x_hc": x, "fn": torch.randn(hc, hc * d, generator=g) / (hc * d) ** 0.5,
            "scale": torch.randn(1, generator=g), "base": torch.randn(hc, generator=g)}


HC_HEAD_FUSED_RECORD = Record(
    operator="hc_head_fused",
    call=lambda fn, i, config: dict(fn(i["x_hc"], i["fn"], i["scale"], i["base"], config=config)),
    outputs={"y": "hc_out"},
    cases=(CaseSpec("hc_head_fused", "the final collapse in one call (v4_head_mix then hc_head, as upstream's "
                    "hc_head.py): 4 FP32 streams of a decode step, a real head mix", _hc_head_fused_inputs,
                    geometries=("flash-tiny", "v4-flash")),),
    bad_calls=(BadCall("a head base per stream missing", "hc_head_fused", replaced(base=lambda i: i["base"][:-1]),
                       "head fn/scale/base"),),
    bindings=in_all_folders(golden="hc_head.py::golden_hc_head", entry="hc_head.py::hc_head_test"),
)
