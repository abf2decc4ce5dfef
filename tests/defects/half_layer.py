"""Seeded defects of the attention half-layer (spec §2.3, §6, §7.1): realistic one-bug ports, each a backend
loaded through the registry. Output defects hit the first active row the last rank owns, so the contract
names a rank and a row that only a per-row, per-rank comparison can find."""

import torch

from backends import torch_backend
from kernels.config import LayerKind
from kernels.half_layer import half_layer_call
from kernels.reference import tp
from kernels.reference.attention_layer import REUSE, attention_half_layer
from kernels.sequence_parallel import sp_bounds

_base = torch_backend()
_ops = {name: _base.get(name) for name in _base.operators if name != "attention_half_layer"}


def _layer(inputs, **kw):
    return attention_half_layer(inputs, ops=_ops, **kw)


def _target(out, inputs, wiring, tp_size):
    """(rank, row) of the first active row owned by the last rank that owns one."""
    active, tokens = int(inputs["num_tokens"]), int(inputs["position_ids"].shape[0])
    if wiring == "replicated":
        return tp_size - 1, active // 2
    bounds = sp_bounds(active, tp_size, tokens)
    rank = max(r for r, b in enumerate(bounds) if b.count)
    return rank, 0


def _with_row_error(edit):
    def layer(inputs, *, kind, phase, wiring, tp, config=None, **kw):
        out = _layer(inputs, kind=kind, phase=phase, wiring=wiring, tp=tp, **({"config": config} if config else {}),
                     **kw)
        rank, row = _target(out, inputs, wiring, tp)
        y = out["output"].clone()
        y[rank, row] = edit(y[rank, row].float()).to(y.dtype)
        if wiring == "replicated":
            y[:] = y[rank]  # every replica carries the same wrong row
        return {**out, "output": y}

    return layer


def _one_large(row):
    """Wrong: one element off by 7 % of the row's RMS (the row's RMS error is then under 1 %: only the peak
    clause sees it)."""
    row = row.clone()
    row[3] += 0.07 * float(row.pow(2).mean().sqrt())
    return row


def _spread(row):
    """Wrong: the whole row off by 1.3 % (just over the 1 % RMS bound, far under the 5 % peak bound)."""
    return row * 1.013


def _nan(row):
    """Wrong: a NaN in one element."""
    row = row.clone()
    row[5] = float("nan")
    return row


ONE_LARGE_ERROR = _base.derive("defect:layer-one-large-error", attention_half_layer=_with_row_error(_one_large))
SPREAD_ERROR = _base.derive("defect:layer-spread-error", attention_half_layer=_with_row_error(_spread))
NAN_ROW = _base.derive("defect:layer-nan-row", attention_half_layer=_with_row_error(_nan))


def _sentinel_padding(partials, *, active_tokens, capacity=None):
    """Wrong: the ReduceScatter leaves the padding rows of each slab as the harness initialized them (13.0)."""
    slabs = tp.tp_reduce_scatter(partials, active_tokens=active_tokens, capacity=capacity)
    for slab, b in zip(slabs, sp_bounds(active_tokens, len(partials), capacity), strict=True):
        slab[b.count:] = 13.0
    return slabs


def _reversed_scatter(partials, *, active_tokens, capacity=None):
    """Wrong, in the sharded wiring only: the ReduceScatter sums the partials in reverse rank order."""
    return tp.tp_reduce_scatter(list(reversed(partials)), active_tokens=active_tokens, capacity=capacity)


def _cast_first(partials):
    """Wrong: each rank's FP32 partial is cast to BF16 before the all-reduce sum."""
    return tp.tp_all_reduce([p.to(torch.bfloat16).float() for p in partials])


STALE_SLAB_PADDING = _base.derive("defect:layer-stale-slab-padding", tp_reduce_scatter=_sentinel_padding)
SHARDED_REVERSED = _base.derive("defect:layer-sharded-reversed", tp_reduce_scatter=_reversed_scatter)
CAST_BEFORE_SUM = _base.derive("defect:layer-cast-before-sum", tp_all_reduce=_cast_first)


def _reuse_republishes(inputs, *, kind, **kw):
    """Wrong: a REUSE layer writes its selected compressed rows back (re-encoded from halved values), in place into
    the caller's cache tensors."""
    out = _layer(inputs, kind=kind, **kw)
    if LayerKind(kind) not in REUSE:
        return out
    from kernels import cache as cache_abi

    config = kw.get("config") or __import__("kernels.config", fromlist=["FLASH_TINY"]).FLASH_TINY
    layout = cache_abi.layouts(config)["compressed_r2" if LayerKind(kind) is LayerKind.C2A_REUSE else "compressed_r1"]
    cache = cache_abi.QuantCache(layout, out["compressed_payload"], out["compressed_scale"])
    rows = out["topk_indices"][0]
    rows = rows[rows >= 0].to(torch.int64)
    values = cache_abi.cache_read(cache, dtype=torch.float32).reshape(-1, layout.logical_width)[rows] * 0.5
    cache = cache_abi.cache_publish(cache, values, rows)
    # as a device writes an InOut buffer: into the caller's tensors (a replay must hand it copies, RP-06)
    inputs["compressed_payload"].copy_(cache.payload)
    inputs["compressed_scale"].copy_(cache.scale)
    return {**out, "compressed_payload": inputs["compressed_payload"], "compressed_scale": inputs["compressed_scale"]}


def _lenient_call(kind, *, phase, tokens, active=None, **kw):
    """Wrong: C2A FULL decode accepts an inactive suffix too (validated as if it were C2A REUSE)."""
    if LayerKind(kind) is LayerKind.C2A_FULL and phase == "decode":
        kind = LayerKind.C2A_REUSE
    return half_layer_call(kind, phase=phase, tokens=tokens, active=active, **kw)


def _token_rope_for_compressed(inputs, **kw):
    """Wrong: the compressed latent and index keys get the token RoPE profile at the token positions."""
    if "compressed_rope_cos" in inputs:
        inputs = {**inputs, "compressed_rope_cos": inputs["rope_cos"], "compressed_rope_sin": inputs["rope_sin"]}
    return _layer(inputs, **kw)


def _window_one_past(inputs, *, config=None, **kw):
    """Wrong: the window read takes one row more than the sliding window (the row that just left it, where its
    page is still mapped)."""
    from kernels.config import FLASH_TINY

    c = config or FLASH_TINY
    table, bs = inputs["window_block_table"], c.block_size
    extra = torch.full((inputs["window_indices"].shape[0], 1), -1, dtype=inputs["window_indices"].dtype)
    for t, (p, r) in enumerate(zip(inputs["position_ids"].tolist(), inputs["token_to_req_indices"].tolist(),
                                   strict=True)):
        old = p - c.sliding_window
        if r >= 0 and old >= 0 and int(table[r, old // bs]) >= 0:
            extra[t, 0] = int(table[r, old // bs]) * bs + old % bs
    wide = torch.cat((extra, inputs["window_indices"]), dim=1)
    return _layer({**inputs, "window_indices": wide}, config=c, **kw)


REUSE_REPUBLISHES = _base.derive("defect:layer-reuse-republishes", attention_half_layer=_reuse_republishes)
C2A_FULL_ACCEPTS_SUFFIX = _base.derive("defect:layer-c2a-full-suffix", half_layer_call=_lenient_call)
TOKEN_ROPE_FOR_COMPRESSED = _base.derive("defect:layer-token-rope-compressed",
                                         attention_half_layer=_token_rope_for_compressed)
WINDOW_ONE_PAST = _base.derive("defect:layer-window-one-past", attention_half_layer=_window_one_past)


def _zero_inactive(inputs, *, wiring, **kw):
    """Wrong: the replicated entry zero-fills the whole output buffer, so inactive rows lose the caller's 13.0."""
    out = _layer(inputs, wiring=wiring, **kw)
    if wiring == "replicated":
        active = int(inputs["num_tokens"])
        y = out["output"].clone()
        y[:, active:] = 0
        out = {**out, "output": y}
    return out


def _physical_order(scores, block_table, request_ids, *, topk, block_size):
    """Wrong: the selected rows are sorted by physical row id, not by logical position (§5.1 step 7)."""
    from kernels.reference.indexer import select_topk

    rows = select_topk(scores, block_table, request_ids, topk=topk, block_size=block_size)
    valid = rows >= 0
    key = torch.where(valid, rows, torch.iinfo(torch.int32).max)
    return torch.sort(key, dim=-1).values.masked_fill(~torch.sort(valid.int(), dim=-1, descending=True).values.bool(),
                                                      -1).to(rows.dtype)


def _default_candidates(inputs, *, kind, **kw):
    """Wrong: a REINDEX call without layer 20's candidate mask scores every position instead of refusing."""
    if LayerKind(kind) is LayerKind.C1A_REINDEX and "candidate_mask" not in inputs:
        width = max(int(inputs["compressed_lens"].max()), 1)
        inputs = {**inputs, "candidate_mask": torch.ones((inputs["position_ids"].shape[0], width), dtype=torch.uint8)}
    return _layer(inputs, kind=kind, **kw)


INACTIVE_ZEROED = _base.derive("defect:layer-inactive-zeroed", attention_half_layer=_zero_inactive)
TOPK_PHYSICAL_ORDER = _base.derive("defect:layer-topk-physical-order", select_topk=_physical_order)
DEFAULT_CANDIDATES = _base.derive("defect:layer-default-candidates", attention_half_layer=_default_candidates)
