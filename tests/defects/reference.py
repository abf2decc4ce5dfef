"""Seeded defects of the compressor ring, RoPE rows and Top-K selection."""

import torch

from backends import torch_backend
from kernels.reference import compressor as comp
from kernels.reference import indexer as ix
from kernels.reference import rope

REF = comp.compressor_ratio2


def _all_rows_write(x, qsl, pos, req, table, state, weights, **kw):
    """Wrong: every chunk row writes its ring slot (two writers per slot when chunk > capacity); the race
    is modelled by the earliest writer landing last."""
    latent, publish, _ = REF(x, qsl, pos, req, table, state, weights, **kw)
    new = state.clone()
    total = int(qsl[-1])
    kv, score = comp.project(x[:total], weights.wkv), comp.project(x[:total], weights.wgate)
    d = weights.wkv.shape[1]
    cap = state.shape[1]
    for r in range(table.shape[0]):
        block = int(table[r, 0])
        if not 0 <= block < state.shape[0]:
            continue
        for t in reversed(range(int(qsl[r]), min(int(qsl[r + 1]), total))):
            if int(req[t]) == r and int(pos[t]) >= 0:
                new[block, int(pos[t]) % cap, :d] = kv[t]
                new[block, int(pos[t]) % cap, d:] = score[t]
    return latent, publish, new


def _partner_wrong_slot(x, qsl, pos, req, table, state, weights, **kw):
    """Wrong: a chunk-start partner is read from slot p % cap instead of (p - 1) % cap."""
    shifted = state.roll(-1, dims=1)  # shifted[:, (s-1) % cap] = state[:, s]
    latent, publish, _ = REF(x, qsl, pos, req, table, shifted, weights, **kw)
    _, _, new = REF(x, qsl, pos, req, table, state, weights, **kw)
    return latent, publish, new


def _rope_into_padding(freqs_cos, freqs_sin, position_ids, num_tokens, rope_cos, rope_sin):
    """Wrong: rows >= num_tokens are overwritten with the identity rotation."""
    rope.materialize_rope_rows(freqs_cos, freqs_sin, position_ids, num_tokens, rope_cos, rope_sin)
    rope_cos[num_tokens:] = 1.0
    rope_sin[num_tokens:] = 0.0


def _wrap_topk(mutate):
    def select(scores, block_table, request_ids, *, topk, block_size):
        out = ix.select_topk(scores, block_table, request_ids, topk=topk, block_size=block_size)
        for t in range(out.shape[0]):
            mutate(out, t, scores, block_table, request_ids, block_size)
        return out
    return select


def _duplicate(out, t, *_):
    n = int((out[t] >= 0).sum())
    if n >= 2:
        out[t, 1] = out[t, 0]


def _hole(out, t, *_):
    n = int((out[t] >= 0).sum())
    if 0 < n < out.shape[1]:
        out[t, 1:n + 1] = out[t, :n].clone()
        out[t, 0] = -1


def _reversed(out, t, *_):
    n = int((out[t] >= 0).sum())
    out[t, :n] = out[t, :n].flip(0)


def _outside(out, t, scores, block_table, request_ids, block_size):
    n = int((out[t] >= 0).sum())
    if n:
        out[t, n - 1] = (int(block_table.max()) + 1) * block_size  # a page no request owns


def _cutoff_swap(out, t, scores, block_table, request_ids, block_size):
    """Replace the best selected position with the worst finite unselected one (kept in logical order)."""
    row = scores[t]
    finite = torch.isfinite(row).nonzero().flatten().tolist()
    n = int((out[t] >= 0).sum())
    if n == 0 or len(finite) <= n:
        return
    chosen = sorted(torch.sort(-row, stable=True).indices[:n].tolist())
    best = max(chosen, key=lambda j: float(row[j]))
    worst = min((j for j in finite if j not in chosen), key=lambda j: float(row[j]))
    new = sorted([j for j in chosen if j != best] + [worst])
    phys = ix.logical_to_physical(block_table, request_ids[t:t + 1], torch.tensor([new]), block_size)
    out[t, :n] = phys[0].to(torch.int32)


def _block_by_batch_row(x, qsl, pos, req, table, state, weights, **kw):
    """Wrong: the ring block is the batch row, not the engine's state block table entry."""
    rows = torch.arange(table.shape[0], dtype=table.dtype).reshape(-1, 1)
    live = torch.where(table >= 0, rows % state.shape[0], table)
    return REF(x, qsl, pos, req, live, state, weights, **kw)


def _negative_block_wraps(x, qsl, pos, req, table, state, weights, **kw):
    """Wrong: block -1 indexes the last block (Python negative indexing) instead of meaning inactive."""
    return REF(x, qsl, pos, req, torch.where(table == -1, state.shape[0] - 1, table), state, weights, **kw)


def _writes_neighbor_block(x, qsl, pos, req, table, state, weights, **kw):
    """Wrong: the ring write also lands in the next block."""
    latent, publish, new = REF(x, qsl, pos, req, table, state, weights, **kw)
    for r in range(table.shape[0]):
        b = int(table[r, 0])
        if 0 <= b < state.shape[0] - 1 and not torch.equal(new[b], state[b]):
            new[b + 1] = new[b]
    return latent, publish, new


def _num_tokens_from_shape(x, qsl, pos, req, table, state, weights, **kw):
    """Wrong: the token count comes from the tensor extent, not query_start_loc[-1]."""
    q = qsl.clone()
    q[-1] = x.shape[0]
    return REF(x, q, pos, req, table, state, weights, **kw)


def _lenient_state(x, qsl, pos, req, table, state, weights, **kw):
    """Wrong: a state cache of the wrong dtype or width is coerced instead of rejected."""
    d = weights.wkv.shape[1]
    s = state.float()
    if s.shape[2] < 2 * d:
        s = torch.nn.functional.pad(s, (0, 2 * d - s.shape[2]))
    return REF(x, qsl, pos, req, table, s, weights, **kw)


def _clamp_positions(freqs_cos, freqs_sin, position_ids, num_tokens, rope_cos, rope_sin):
    """Wrong: positions beyond the table are clamped to its last row; other bad input coerced."""
    n = max(0, min(int(num_tokens), position_ids.shape[0]))
    pos = position_ids.to(torch.int64).clamp(max=freqs_cos.shape[0] - 1).to(torch.int32)
    rope.materialize_rope_rows(freqs_cos, freqs_sin, pos, n, rope_cos, rope_sin)


def _topk_logical_ids(scores, block_table, request_ids, *, topk, block_size):
    """Wrong: returns request-local logical positions instead of physical rows."""
    out = torch.full((scores.shape[0], topk), -1, dtype=torch.int32)
    k = min(topk, scores.shape[1])
    if k:
        order = torch.sort(torch.sort(-scores, dim=-1, stable=True).indices[:, :k], dim=-1).values
        for t in range(scores.shape[0]):
            keep = order[t][torch.isfinite(scores[t, order[t]])]
            out[t, : keep.numel()] = keep.to(torch.int32)
    return out


def _candidates_no_force(scores, compressed_lens, *, block, topk_blocks, width=None):
    """Wrong: the block holding the newest position is not forced into the candidate set."""
    return ix.candidate_blocks(scores, torch.zeros_like(compressed_lens), block=block,
                                      topk_blocks=topk_blocks, width=width)


# registrations: each defect is the torch backend with one operator replaced
_base = torch_backend()
def _shared_block_unchecked(*args, **kwargs):
    """Wrong: two requests on one state block are not refused (the check dropped; the ring updated in place)."""
    return REF(*args, shared_block="in_place", **kwargs)


COMPRESSOR_SHARED_BLOCK_UNCHECKED = _base.derive("defect:compressor-shared-block-unchecked",
                                                 compressor_ratio2=_shared_block_unchecked)
def _num_tokens_from_qsl(*args, num_tokens=None, **kw):
    """Wrong: an explicit num_tokens is ignored; the active rows are always qsl[-1]."""
    return REF(*args, **kw)


def _whole_requests_only(x, qsl, *args, num_tokens=None, **kw):
    """Wrong: num_tokens cuts only at a request boundary (the last request that ends by it)."""
    if num_tokens is not None:
        ends = [int(v) for v in qsl[1:] if int(v) <= int(num_tokens)]
        num_tokens = ends[-1] if ends else 0
    return REF(x, qsl, *args, num_tokens=num_tokens, **kw)


COMPRESSOR_NUM_TOKENS_FROM_QSL = _base.derive("defect:compressor-num-tokens-from-qsl",
                                              compressor_ratio2=_num_tokens_from_qsl)
COMPRESSOR_WHOLE_REQUESTS_ONLY = _base.derive("defect:compressor-whole-requests-only",
                                              compressor_ratio2=_whole_requests_only)
COMPRESSOR_ALL_ROWS_WRITE = _base.derive("defect:compressor-all-rows-write", compressor_ratio2=_all_rows_write)
COMPRESSOR_PARTNER_WRONG_SLOT = _base.derive("defect:compressor-partner-wrong-slot",
                                             compressor_ratio2=_partner_wrong_slot)
ROPE_INTO_PADDING = _base.derive("defect:rope-into-padding", materialize_rope_rows=_rope_into_padding)
TOPK_DUPLICATE = _base.derive("defect:topk-duplicate", select_topk=_wrap_topk(_duplicate))
TOPK_HOLE = _base.derive("defect:topk-hole", select_topk=_wrap_topk(_hole))
TOPK_REVERSED = _base.derive("defect:topk-reversed", select_topk=_wrap_topk(_reversed))
TOPK_OUTSIDE = _base.derive("defect:topk-outside", select_topk=_wrap_topk(_outside))
TOPK_CUTOFF_SWAP = _base.derive("defect:topk-cutoff-swap", select_topk=_wrap_topk(_cutoff_swap))
COMPRESSOR_BLOCK_BY_BATCH_ROW = _base.derive("defect:compressor-block-by-batch-row", compressor_ratio2=_block_by_batch_row)
COMPRESSOR_NEGATIVE_BLOCK_WRAPS = _base.derive("defect:compressor-negative-block-wraps",
                                               compressor_ratio2=_negative_block_wraps)
COMPRESSOR_WRITES_NEIGHBOR = _base.derive("defect:compressor-writes-neighbor", compressor_ratio2=_writes_neighbor_block)
COMPRESSOR_NUM_TOKENS_FROM_SHAPE = _base.derive("defect:compressor-num-tokens-from-shape",
                                                compressor_ratio2=_num_tokens_from_shape)
COMPRESSOR_LENIENT_STATE = _base.derive("defect:compressor-lenient-state", compressor_ratio2=_lenient_state)
ROPE_CLAMPS_POSITIONS = _base.derive("defect:rope-clamps-positions", materialize_rope_rows=_clamp_positions)
TOPK_LOGICAL_IDS = _base.derive("defect:topk-logical-ids", select_topk=_topk_logical_ids)
CANDIDATES_NO_FORCE = _base.derive("defect:candidates-no-force", candidate_blocks=_candidates_no_force)
