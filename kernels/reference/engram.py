"""The Engram block of V4.1 (layers 1 and 14, applied before the layer): a gated n-gram lookup added to every
hyper-connection stream.

* ``engram``: each token row's ``(max_ngram - 1) · n_heads`` hash ids (computed host-side) pick rows of the
  BF16 table [rows, head_dim]; the rows, flattened, times ``wkv`` [cols · head_dim, (hc + 1) · D] (BF16
  operands, the products summed exactly and rounded once to FP32) give one key per stream (the first hc · D columns) and one value shared by
  all streams (the last D). Per stream c: dot = Σ x·weight·key · rsqrt(mean x² + eps) · rsqrt(mean key² +
  eps) · D^-1/2, gate = sigmoid(sign(dot) · sqrt(max(|dot|, 1e-6))), out = x + gate · value, one BF16
  rounding. ``weight`` [hc, D] FP32 is the folded per-channel q·k scale.
* ``engram_tp``: the table row-sharded over ``tp`` ranks (rows / tp each); every rank gathers the full id
  set against its own shard with zeros for rows it does not hold; the partial lookups sum exactly (one
  non-zero contributor per element), so every rank's output is the single-rank output, bit for bit. At
  most ``ENGRAM_TP_WINDOW`` (256) token rows fit the all-reduce window.

Spec: §1 (Engram layers 1 and 14, rms_norm_eps); upstream_checks HC-13, HC-14.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels.config import FLASH, SUPPORTED_TP, V41Config
from kernels.errors import ContractInputError
from kernels.operators import operator

SPEC = "§1"
ROUNDING_VERSION = "engram-1"
CLAMP = 1e-6
ENGRAM_TP_WINDOW = 256


def hash_columns(config: V41Config = FLASH) -> int:
    return (config.engram_max_ngram_size - 1) * config.engram_n_heads


def _check(hash_ids: torch.Tensor, rows: int, wkv: torch.Tensor, weight: torch.Tensor, x: torch.Tensor,
           config: V41Config) -> None:
    hc, d, cols, hd = config.hc_mult, config.hidden_size, hash_columns(config), config.engram_head_dim
    if hash_ids.ndim != 2 or hash_ids.shape[1] != cols or hash_ids.is_floating_point():
        raise ContractInputError("hash_ids", None, f"integer [T, {cols}]", f"{hash_ids.dtype}{list(hash_ids.shape)}",
                                 "HC-13")
    if x.shape != (hash_ids.shape[0], hc, d):
        raise ContractInputError("x", None, f"[{hash_ids.shape[0]}, {hc}, {d}]", list(x.shape), "HC-13")
    if wkv.shape != (cols * hd, (hc + 1) * d) or weight.shape != (hc, d):
        raise ContractInputError("engram weights", None, f"wkv [{cols * hd}, {(hc + 1) * d}], weight [{hc}, {d}]",
                                 [list(wkv.shape), list(weight.shape)], "HC-13")
    bad = (hash_ids < 0) | (hash_ids >= rows)
    if bool(bad.any()):
        t, c = (int(v) for v in bad.nonzero()[0])
        raise ContractInputError("hash_ids", (t, c), f"a table row in [0, {rows})", int(hash_ids[t, c]), "HC-13")


def _gate_and_add(lookup: torch.Tensor, wkv: torch.Tensor, weight: torch.Tensor, x: torch.Tensor,
                  config: V41Config) -> torch.Tensor:
    hc, d, eps = config.hc_mult, config.hidden_size, config.rms_norm_eps
    kv = (lookup.to(torch.bfloat16).double() @ wkv.to(torch.bfloat16).double()).float()
    key, value = kv[:, :hc * d].unflatten(-1, (hc, d)), kv[:, hc * d:]
    h = x.float()
    rstd = torch.rsqrt(h.square().mean(-1, keepdim=True) + eps) * torch.rsqrt(key.square().mean(-1, keepdim=True) + eps)
    dot = (h * weight.float()[None] * key).sum(-1, keepdim=True) * rstd * d**-0.5
    gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(CLAMP).sqrt(), dot))
    return (h + gate * value[:, None, :]).to(torch.bfloat16)


@operator(returns='[T, hc, D] BF16: x + sigmoid-sqrt gate · the shared value, per stream', spec='§1')
def engram(hash_ids: torch.Tensor, table: torch.Tensor, wkv: torch.Tensor, weight: torch.Tensor,
           x: torch.Tensor, *, config: V41Config = FLASH) -> torch.Tensor:
    """hash_ids [T, cols], table [rows, head_dim] BF16, wkv [cols·head_dim, (hc+1)·D], weight [hc, D] FP32,
    x [T, hc, D] -> [T, hc, D] BF16. Spec: HC-13."""
    _check(hash_ids, table.shape[0], wkv, weight, x, config)
    lookup = table[hash_ids.long()].flatten(1)
    return _gate_and_add(lookup, wkv, weight, x, config)


@operator(returns='list of tp [T, hc, D] BF16 outputs (each the single-rank output)', spec='§1')
def engram_tp(hash_ids: torch.Tensor, table_shards: Sequence[torch.Tensor], wkv: torch.Tensor,
              weight: torch.Tensor, x: torch.Tensor, *, tp: int, config: V41Config = FLASH) -> list[torch.Tensor]:
    """The row-sharded Engram: ``table_shards`` one per rank (rows / tp each, in rank order) -> one output
    per rank (all equal). Spec: HC-14."""
    if isinstance(tp, bool) or tp not in SUPPORTED_TP:
        raise ContractInputError("tp", None, f"one of {SUPPORTED_TP}", tp, "HC-14")
    if len(table_shards) != tp:
        raise ContractInputError("table_shards", None, f"one per rank ({tp})", len(table_shards), "HC-14")
    per = table_shards[0].shape[0]
    if any(s.shape != table_shards[0].shape for s in table_shards):
        raise ContractInputError("table_shards", None, f"{tp} equal shards of [rows/tp, head_dim]",
                                 [list(s.shape) for s in table_shards], "HC-14")
    _check(hash_ids, per * tp, wkv, weight, x, config)
    if hash_ids.shape[0] > ENGRAM_TP_WINDOW:
        raise ContractInputError("hash_ids", None, f"at most {ENGRAM_TP_WINDOW} token rows (the TP lookup window)",
                                 hash_ids.shape[0], "HC-14")
    ids = hash_ids.long()
    partials = []
    for rank, shard in enumerate(table_shards):
        local = ids - rank * per
        mine = (local >= 0) & (local < per)
        rows = shard[local.clamp(0, per - 1)] * mine[..., None].to(shard.dtype)
        partials.append(rows.flatten(1))
    lookup = torch.stack(partials).float().sum(0)  # exact: one non-zero contributor per element
    out = _gate_and_add(lookup, wkv, weight, x, config)
    return [out.clone() for _ in range(tp)]
