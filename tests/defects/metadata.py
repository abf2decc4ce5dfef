"""Seeded ForwardMetadata defects: each wraps the reference builder and breaks one rule."""

from dataclasses import replace

import torch

from backends import torch_backend
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


# ---- one defect for every remaining metadata invariant -------------------------------------------


def _new_kv_not_updated(meta, config):
    """Wrong: new_kv_seq_lens reports the previous length (query lens not added)."""
    return replace(meta, new_kv_seq_lens=meta.kv_seq_lens.clone())


def _token_req_skips_empty(meta, config):
    """Wrong: tokens are numbered by non-empty request, as if empty requests did not exist."""
    req = meta.token_to_req_indices.clone()
    nonempty = (meta.query_lens > 0).nonzero().flatten()
    rank = {int(r): i for i, r in enumerate(nonempty)}
    for t in range(meta.num_tokens):
        req[t] = rank[int(req[t])]
    return replace(meta, token_to_req_indices=req)


def _compressed_lens_not_causal(meta, config):
    """Wrong: compressed_lens = p // ratio (misses the group completing at p)."""
    out = {}
    for src in meta.compressed_lens:
        p = meta.position_ids.to(torch.int64)
        out[src] = torch.where(p >= 0, p // config.compress_ratios[src], 0).to(torch.int32)
    return replace(meta, compressed_lens=out)


def _compressor_source_first_row(meta, config):
    """Wrong: compressor source rows point at the group's first token instead of its completing one."""
    out = {}
    for src, rows in meta.compressor_source_token_indices.items():
        out[src] = rows - (config.compress_ratios[src] - 1)
    return replace(meta, compressor_source_token_indices=out)


def _rope_position_is_completing(meta, config):
    """Wrong: compressed RoPE position = p (the completing position) instead of p + 1 - ratio."""
    out = {}
    for src, v in meta.compressed_rope_position_ids.items():
        out[src] = torch.where(v >= 0, meta.position_ids, v).to(torch.int32)
    return replace(meta, compressed_rope_position_ids=out)


def _inactive_to_dummy_row(meta, config):
    """Wrong: inactive-state tokens publish to a shared dummy row 0 instead of -1."""
    out, out_idx = {}, {}
    for src, slots in meta.compressed_slots.items():
        if src in meta.state_block_tables:
            p = meta.position_ids.to(torch.int64)
            req = meta.token_to_req_indices.to(torch.int64)
            inactive = torch.zeros_like(slots, dtype=torch.bool)
            active = req >= 0
            inactive[active] = meta.state_block_tables[src][req[active], 0] < 0
            complete = (p + 1) % config.compress_ratios[src] == 0
            slots = torch.where(inactive & complete & (p >= 0), torch.zeros_like(slots), slots)
        out[src], out_idx[src] = slots, slots.clone()
    return replace(meta, compressed_slots=out, index_slots=out_idx)


def _logit_first_row(meta, config):
    """Wrong: logits taken from each request's first row."""
    q = meta.query_start_loc
    return replace(meta, logit_row_indices=torch.where(meta.query_lens > 0, q[:-1], -1).to(torch.int32))


def _window_slots_int32(meta, config):
    """Wrong: window_slots narrowed to INT32 (the spec says I64)."""
    return replace(meta, window_slots=meta.window_slots.to(torch.int32))


def _sanitize(build_kwargs_fn):
    """A builder that 'repairs' bad input instead of rejecting it, then calls the reference."""
    def build(*args, **kwargs):
        return BUILD(*args, **build_kwargs_fn(dict(kwargs)))
    return build


def _clamp_qsl(kw):
    """Wrong: a decreasing query_start_loc is repaired with a running max instead of rejected."""
    q = torch.as_tensor(kw["query_start_loc"]).clone()
    kw["query_start_loc"] = torch.cummax(q, 0).values
    return kw


def _clamp_kv(kw):
    """Wrong: negative kv_seq_lens are clamped to 0 instead of rejected."""
    kw["kv_seq_lens"] = torch.as_tensor(kw["kv_seq_lens"]).clamp_min(0)
    return kw


def _unchecked_pages(kw):
    """Wrong (the G1 bug pinned by PR1280): a -1 page yields a bogus slot instead of an error."""
    t = torch.as_tensor(kw["window_block_table"])
    kw["window_block_table"] = torch.where(t < 0, torch.full_like(t, 10_000), t)
    return kw


def _no_allocation_check(kw):
    """Wrong: missing visible compressed pages are not detected (the page is silently remapped)."""
    kw["compressed_block_tables"] = {s: torch.where(torch.as_tensor(t) < 0, 20_000, torch.as_tensor(t))
                                     for s, t in kw["compressed_block_tables"].items()}
    return kw


def _state_below_minus_one_ok(kw):
    """Wrong: state blocks < -1 are treated as inactive instead of rejected."""
    kw["state_block_tables"] = {s: t.clamp_min(-1) if isinstance(t, torch.Tensor) and t.dtype == torch.int32 else t
                                for s, t in kw["state_block_tables"].items()}
    return kw


def _any_tp(kw):
    """Wrong: any TP size is accepted (rounded to a supported one)."""
    tp = kw.get("tp_size", 1)
    kw["tp_size"] = min((1, 2, 4, 8), key=lambda s: abs(s - tp)) if isinstance(tp, int) else tp
    return kw


def _lenient_state_dtype(kw):
    """Wrong: INT64 (or otherwise typed) state tables are silently cast to INT32."""
    kw["state_block_tables"] = {s: torch.as_tensor(t).to(torch.int32) for s, t in kw["state_block_tables"].items()}
    return kw


# registrations: each defect is the torch backend with one operator replaced
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
NEW_KV_NOT_UPDATED = _base.derive("defect:new-kv-not-updated", build_forward_metadata=_patch(_new_kv_not_updated))
TOKEN_REQ_SKIPS_EMPTY = _base.derive("defect:token-req-skips-empty",
                                     build_forward_metadata=_patch(_token_req_skips_empty))
COMPRESSED_LENS_NOT_CAUSAL = _base.derive("defect:compressed-lens-not-causal",
                                          build_forward_metadata=_patch(_compressed_lens_not_causal))
COMPRESSOR_SOURCE_FIRST_ROW = _base.derive("defect:compressor-source-first-row",
                                           build_forward_metadata=_patch(_compressor_source_first_row))
ROPE_POSITION_IS_COMPLETING = _base.derive("defect:rope-position-is-completing",
                                           build_forward_metadata=_patch(_rope_position_is_completing))
INACTIVE_TO_DUMMY_ROW = _base.derive("defect:inactive-to-dummy-row",
                                     build_forward_metadata=_patch(_inactive_to_dummy_row))
LOGIT_FIRST_ROW = _base.derive("defect:logit-first-row", build_forward_metadata=_patch(_logit_first_row))
WINDOW_SLOTS_INT32 = _base.derive("defect:window-slots-int32", build_forward_metadata=_patch(_window_slots_int32))
CLAMPS_QSL = _base.derive("defect:clamps-qsl", build_forward_metadata=_sanitize(_clamp_qsl))
CLAMPS_KV = _base.derive("defect:clamps-kv", build_forward_metadata=_sanitize(_clamp_kv))
UNCHECKED_PAGES = _base.derive("defect:unchecked-pages", build_forward_metadata=_sanitize(_unchecked_pages))
NO_ALLOCATION_CHECK = _base.derive("defect:no-allocation-check", build_forward_metadata=_sanitize(_no_allocation_check))
STATE_BELOW_MINUS_ONE_OK = _base.derive("defect:state-below-minus-one-ok",
                                        build_forward_metadata=_sanitize(_state_below_minus_one_ok))
ANY_TP = _base.derive("defect:any-tp", build_forward_metadata=_sanitize(_any_tp))
LENIENT_STATE_DTYPE = _base.derive("defect:lenient-state-dtype", build_forward_metadata=_sanitize(_lenient_state_dtype))
