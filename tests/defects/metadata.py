"""Seeded ForwardMetadata defects: each wraps the reference builder and breaks one rule."""

from dataclasses import replace

import torch

from contracts.backends import torch_backend
from kernels import metadata as ref

BUILD = ref.build_forward_metadata


def _patch(fn):
    def build(*args, **kwargs):
        return fn(BUILD(*args, **kwargs), kwargs.get("config"))
    return build


def _window_newest_first(meta, config):
    """Wrong: window indices newest first."""
    idx = meta.window_indices.clone()
    for t in range(meta.num_tokens):
        n = int(meta.window_lens[t])
        idx[t, :n] = idx[t, :n].flip(0)
    return replace(meta, window_indices=idx)


def _compressed_slot_off_by_one(*args, **kwargs):
    """Wrong: publishes at p % ratio == 0 instead of (p+1) % ratio == 0 (row p//ratio)."""
    meta = BUILD(*args, **kwargs)
    config = kwargs["config"]
    bs = config.block_size
    slots = {}
    for src, old in meta.compressed_slots.items():
        ratio = config.compress_ratios[src]
        table = torch.as_tensor(kwargs["compressed_block_tables"][src]).long() if "compressed_block_tables" in kwargs \
            else torch.as_tensor(args[3][src]).long()
        new = torch.full_like(old, -1)
        for t in range(meta.num_tokens):
            p, r = int(meta.position_ids[t]), int(meta.token_to_req_indices[t])
            if p % ratio == 0:
                logical = p // ratio
                page = logical // bs
                if page < table.shape[1] and table[r, page] >= 0:
                    new[t] = int(table[r, page]) * bs + logical % bs
        slots[src] = new
    return replace(meta, compressed_slots=slots, index_slots={s: v.clone() for s, v in slots.items()})


def _inactive_state_not_forced(*args, **kwargs):
    """Wrong: a -1 state block does not force its tokens' compressed/index slots to -1."""
    states = kwargs["state_block_tables"]
    # distinct dummy blocks so the builder's own validation passes
    fake = {s: torch.where(t < 0, 10_000 + torch.arange(t.shape[0], dtype=t.dtype).reshape(-1, 1), t)
            for s, t in states.items()}
    meta = BUILD(*args, **{**kwargs, "state_block_tables": fake})
    return replace(meta, state_block_tables={s: states[s] for s in meta.state_block_tables})


def _moe_owners_by_slab(meta, config):
    """Wrong (a fork variant): moe_token_owners = t // ceil(T/TP) instead of t % TP."""
    cap = meta.capacity
    tp = int(meta.moe_token_owners.max()) + 1 if cap else 1
    slab = max(1, -(-cap // tp))
    return replace(meta, moe_token_owners=(torch.arange(cap) // slab).to(torch.int32))


def _state_by_batch_row(meta, config):
    """Wrong: state table derived from the batch row, not passed through."""
    return replace(meta, state_block_tables={s: torch.arange(t.shape[0], dtype=torch.int32).reshape(-1, 1)
                                             for s, t in meta.state_block_tables.items()})


def _identity_pages(*args, **kwargs):
    """Wrong: ignores the physical page table (slot = request-local logical row)."""
    def identity(t):
        t = torch.as_tensor(t)
        return torch.arange(t.shape[1], dtype=t.dtype).expand_as(t) + \
            (torch.arange(t.shape[0], dtype=t.dtype) * t.shape[1]).reshape(-1, 1)
    kwargs = {**kwargs, "window_block_table": identity(kwargs["window_block_table"]),
              "compressed_block_tables": {s: identity(t) for s, t in kwargs["compressed_block_tables"].items()}}
    return BUILD(*args, **kwargs)


def _no_state_dedup(*args, **kwargs):
    """Wrong: accepts two live requests sharing one state block."""
    states = kwargs["state_block_tables"]
    uniq = {s: torch.where(t >= 0, t * 1000 + torch.arange(t.shape[0], dtype=t.dtype).reshape(-1, 1), t)
            for s, t in states.items() if t.dtype == torch.int32 and t.ndim == 2}
    meta = BUILD(*args, **{**kwargs, "state_block_tables": {**states, **uniq}})
    return replace(meta, state_block_tables={s: states[s] for s in meta.state_block_tables})


def _padding_rows_zero(meta, config):
    """Wrong: padding rows carry 0 (a valid position/request) instead of -1."""
    n = meta.num_tokens
    pos, req = meta.position_ids.clone(), meta.token_to_req_indices.clone()
    pos[n:] = 0
    req[n:] = 0
    return replace(meta, position_ids=pos, token_to_req_indices=req)


_base = torch_backend()
WINDOW_NEWEST_FIRST = _base.derive("defect:window-newest-first", build_forward_metadata=_patch(_window_newest_first))
COMPRESSED_SLOT_OFF_BY_ONE = _base.derive("defect:compressed-slot-off-by-one",
                                          build_forward_metadata=_compressed_slot_off_by_one)
INACTIVE_STATE_NOT_FORCED = _base.derive("defect:inactive-state-not-forced",
                                         build_forward_metadata=_inactive_state_not_forced)
MOE_OWNERS_BY_SLAB = _base.derive("defect:moe-owners-by-slab", build_forward_metadata=_patch(_moe_owners_by_slab))
STATE_BY_BATCH_ROW = _base.derive("defect:state-by-batch-row", build_forward_metadata=_patch(_state_by_batch_row))
IDENTITY_PAGES = _base.derive("defect:identity-pages", build_forward_metadata=_identity_pages)
NO_STATE_DEDUP = _base.derive("defect:no-state-dedup", build_forward_metadata=_no_state_dedup)
PADDING_ROWS_ZERO = _base.derive("defect:padding-rows-zero", build_forward_metadata=_patch(_padding_rows_zero))
