"""Seeded sequence-parallel defects."""

import torch

from backends import torch_backend
from kernels import sequence_parallel as sp


def _width_from_active(active_tokens, tp, capacity=None):
    """Wrong (the older tp_ep_layer_tail rule): width = ceil(active/TP) instead of ceil(capacity/TP)."""
    return sp.sp_bounds(active_tokens, tp, None if capacity is None else active_tokens)


def _shard_stale_padding(x, token_ids, positions, *, tp, capacity=None):
    """Wrong: padding rows keep a stale copy of the last owned row."""
    slabs = sp.sp_shard(x, token_ids, positions, tp=tp, capacity=capacity)
    for s in slabs:
        n = int(s.valid.sum())
        if 0 < n < s.payload.shape[0]:
            s.payload[n:] = s.payload[n - 1]
    return slabs


def _gather_reversed(slabs, *, active_tokens, capacity=None):
    """Wrong: concatenates owned rows in reverse rank order."""
    sp.check_owner_slabs(slabs, active_tokens=active_tokens, capacity=capacity)
    bounds = sp.sp_bounds(active_tokens, len(slabs), capacity)
    parts = [(s.payload[: b.count], s.token_ids[: b.count], s.positions[: b.count])
             for s, b in zip(slabs, bounds, strict=True)][::-1]
    return tuple(torch.cat([p[i] for p in parts]) for i in range(3))


def _gather_unchecked(slabs, *, active_tokens, capacity=None):
    """Wrong: gathers without checking the padding contract."""
    bounds = sp.sp_bounds(active_tokens, len(slabs), capacity)
    return tuple(torch.cat([getattr(s, f)[: b.count] for s, b in zip(slabs, bounds, strict=True)])
                 for f in ("payload", "token_ids", "positions"))


def _lenient_bounds(active_tokens, tp, capacity=None):
    """Wrong: bad arguments are repaired (negative counts clamped, capacity raised, tp >= 1) instead of rejected."""
    active = max(0, int(active_tokens))
    cap = active if capacity is None else max(int(capacity), active)
    return sp.sp_bounds(active, max(1, int(tp)), cap)


# registrations: each defect is the torch backend with one operator replaced
_base = torch_backend()
WIDTH_FROM_ACTIVE = _base.derive("defect:width-from-active", sp_bounds=_width_from_active)
SHARD_STALE_PADDING = _base.derive("defect:shard-stale-padding", sp_shard=_shard_stale_padding)
GATHER_REVERSED = _base.derive("defect:gather-reversed", sp_gather=_gather_reversed)
GATHER_UNCHECKED = _base.derive("defect:gather-unchecked", sp_gather=_gather_unchecked)
LENIENT_BOUNDS = _base.derive("defect:lenient-bounds", sp_bounds=_lenient_bounds)
