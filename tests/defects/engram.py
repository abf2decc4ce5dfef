"""Seeded defects of the Engram block (upstream_checks HC-13, HC-14): realistic one-bug ports, each a backend
built from the reference with one operator replaced."""

from __future__ import annotations

import torch

from backends import torch_backend
from kernels.reference import engram

_base = torch_backend()


def _gate_without_sqrt(hash_ids, table, wkv, weight, x, *, config=engram.FLASH):
    """Wrong: the gate is sigmoid(dot), the signed square root dropped."""
    engram.engram(hash_ids, table, wkv, weight, x, config=config)  # same validation
    hc, d, eps = config.hc_mult, config.hidden_size, config.rms_norm_eps
    kv = (table[hash_ids.long()].flatten(1).double() @ wkv.double()).float()
    key, value = kv[:, :hc * d].unflatten(-1, (hc, d)), kv[:, hc * d:]
    h = x.float()
    rstd = torch.rsqrt(h.square().mean(-1, keepdim=True) + eps) * torch.rsqrt(key.square().mean(-1, keepdim=True) + eps)
    dot = (h * weight.float()[None] * key).sum(-1, keepdim=True) * rstd * d**-0.5
    return (h + torch.sigmoid(dot) * value[:, None, :]).to(torch.bfloat16)


def _value_first(hash_ids, table, wkv, weight, x, *, config=engram.FLASH):
    """Wrong: the value is read from the first D projected columns and the keys from the rest."""
    hc, d = config.hc_mult, config.hidden_size
    rolled = torch.cat((wkv[:, hc * d:], wkv[:, :hc * d]), dim=1)
    return engram.engram(hash_ids, table, rolled, weight, x, config=config)


def _tp_unmasked(hash_ids, table_shards, wkv, weight, x, *, tp, config=engram.FLASH):
    """Wrong: each rank gathers its clamped local row for ids it does not hold instead of zeros."""
    outs = engram.engram_tp(hash_ids, table_shards, wkv, weight, x, tp=tp, config=config)  # validation
    per = table_shards[0].shape[0]
    ids = hash_ids.long()
    lookup = sum(shard[(ids - r * per).clamp(0, per - 1)].flatten(1).float()
                 for r, shard in enumerate(table_shards))
    out = engram._gate_and_add(lookup, wkv, weight, x, config)
    return [out.clone() for _ in outs]


GATE_WITHOUT_SQRT = _base.derive("defect:engram-gate-without-sqrt", engram=_gate_without_sqrt)
VALUE_FIRST = _base.derive("defect:engram-value-first", engram=_value_first)
TP_UNMASKED = _base.derive("defect:engram-tp-unmasked", engram_tp=_tp_unmasked)
