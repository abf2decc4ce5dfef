"""V4's decode compressors as a state transaction (spec §8; upstream's persistent-state decode ABI of
decode_compressor_ratio4.py -- page ids, page epochs, request epochs and valid ranges -- and the HCA ring the
same way). The paged ring of ``kernels.v4.compressor`` is the special case where every page is current.

Per request b, ``rows`` = 2 · ratio ring rows at ratio 4 (the previous and the current window) or ``ratio`` at
ratio 128, in pages of ``page`` rows (the state pool's second dimension):

* position q lives on ring row q % rows: page ``state_page_ids[b, (q % rows) // page]``, row (q % rows) % page;
* a ring row holds position q only when its page id is >= 0, the page's epoch equals the request's
  (``state_page_epochs[b, k] == request_epochs[b]``: a page recycled from another request, or from this slot's
  previous occupant, is never read) and ``state_valid_ranges[b] = [begin, end)`` contains q;
* this step's own rows (the request's positions first .. the closing one) come from this step's projections
  (the overlay), whatever the state holds;
* a window position neither held nor overlaid takes no part (value 0, score -inf in the softmax) -- positions
  before 0 included;
* the state commit comes after the pooling: row ``state_slot_mapping[t]`` (-1: none) receives token t's
  projections (kv, score + ape[pos % ratio]), and it must be the ring row of the token's position.

The closed window's row is pooled, RMS-normalised and kept FP32 exactly as ``v4_compressor`` does, for
``v4_publish_compressed`` -- or, under the transaction ABI's event list, for ``v4_publish_events``:

* ``request_event_indices`` [B] names each request's closing event of this step (-1: none) and the event's RoPE
  rows ``event_cos`` / ``event_sin`` [E, rope/2] (the caller's rows for the window's first position) rotate the
  request's closed row -- they are used as given, not looked up from a position;
* a request has at most one closing row a step (its first, the one upstream writes); the row goes to that row's
  ``cmp_slot_mapping`` entry (-1: no write) and is rounded once to the pool's dtype;
* a request whose event is -1 publishes nothing even when its closing row has a slot (upstream's Torch golden,
  ``no_event="skip"``, the current rule); upstream's kernel instead writes the row with its RoPE dims 0 (it loads
  no event rows and rotates by cos = sin = 0), kept by name as ``no_event="zero_rope"``.

Spec: §8; docs/coverage.md, V4 section (V4-11, V4-12).
"""

from __future__ import annotations

import torch

from kernels.errors import ContractInputError
from kernels.operators import operator
from kernels.reference.compressor import project
from kernels.v4.compressor import V4CompressorWeights

SPEC = "§8"
ROUNDING_VERSION = "v4-compressor-txn-1"


def ring_rows(ratio: int) -> int:
    """State rows per request: the previous and the current window at ratio 4, one window at ratio 128."""
    return 2 * ratio if ratio == 4 else ratio


def _check(position_ids, seq, state_page_ids, state_page_epochs, request_epochs, state_valid_ranges,
           state_slot_mapping, page, rows) -> None:
    requests = state_page_ids.shape[0]
    if state_page_ids.ndim != 2 or state_page_ids.shape[1] * page < rows:
        raise ContractInputError("state_page_ids", None, f"[B, >= {-(-rows // page)}] pages of {page} rows",
                                 list(state_page_ids.shape), SPEC)
    for name, t, shape in (("state_page_epochs", state_page_epochs, tuple(state_page_ids.shape)),
                           ("request_epochs", request_epochs, (requests,)),
                           ("state_valid_ranges", state_valid_ranges, (requests, 2)),
                           ("position_ids", position_ids, (requests * seq,)),
                           ("state_slot_mapping", state_slot_mapping, (requests * seq,))):
        if tuple(t.shape) != shape:
            raise ContractInputError(name, None, str(list(shape)), list(t.shape), SPEC)
    bad = state_valid_ranges[:, 0] > state_valid_ranges[:, 1]
    if bool(bad.any()):
        b = int(bad.nonzero()[0])
        raise ContractInputError("state_valid_ranges", (b,), "begin <= end", state_valid_ranges[b].tolist(), SPEC)
    pos = position_ids.reshape(requests, seq).to(torch.int64)
    gap = (pos[:, 1:] != pos[:, :1] + torch.arange(1, seq)) | (pos[:, :1] < 0)
    if bool(gap.any()):
        b = int(gap.any(1).nonzero()[0])
        raise ContractInputError("position_ids", (b,), f"{seq} consecutive positions from >= 0 per request",
                                 pos[b].tolist(), SPEC)
    for t in range(requests * seq):
        slot = int(state_slot_mapping[t])
        if slot < 0:
            continue
        q = int(position_ids[t])
        home = int(state_page_ids[t // seq, (q % rows) // page]) * page + (q % rows) % page
        if slot != home:
            raise ContractInputError("state_slot_mapping", (t,), f"-1 or {home} (ring row of position {q})", slot,
                                     SPEC)


@operator(returns='(compressed [T,d] FP32, closes [T], new state pool): the decode compressor as a '
                   'state transaction (only current-epoch pages in the valid range are read; this '
                   'step overlays; the commit follows the pool)',
          spec='§8')
def v4_compressor_txn(x: torch.Tensor, position_ids: torch.Tensor, state_page_ids: torch.Tensor,
                      state_page_epochs: torch.Tensor, request_epochs: torch.Tensor,
                      state_valid_ranges: torch.Tensor, state_slot_mapping: torch.Tensor, state_pool: torch.Tensor,
                      weights: V4CompressorWeights, *, ratio: int, seq: int,
                      eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [B·seq, hidden] (request-major) -> (compressed [T, d] FP32, zero where no window closes; closes [T]
    bool; the new state pool). The input pool is not modified. Spec: §8."""
    overlap = ratio == 4
    coff, d = (2 if overlap else 1), weights.norm.shape[0]
    w = coff * d
    if ratio not in (4, 128):
        raise ContractInputError("ratio", None, "4 or 128", ratio, SPEC)
    if state_pool.ndim != 3 or state_pool.shape[2] != 2 * w or state_pool.dtype != torch.float32:
        raise ContractInputError("state_pool", None, f"FP32 [pages, page, {2 * w}]",
                                 f"{state_pool.dtype}{list(state_pool.shape)}", SPEC)
    pages, page, _ = state_pool.shape
    rows = ring_rows(ratio)
    _check(position_ids, seq, state_page_ids, state_page_epochs, request_epochs, state_valid_ranges,
           state_slot_mapping, page, rows)
    flat = state_pool.reshape(pages * page, 2 * w)
    kv, score = project(x, weights.wkv), project(x, weights.wgate)
    own = torch.cat((kv, score + weights.ape[position_ids.long() % ratio]), dim=1)  # this step's rows

    def held(b: int, q: int) -> torch.Tensor | None:
        k = (q % rows) // page
        page_id = int(state_page_ids[b, k])
        current = page_id >= 0 and int(state_page_epochs[b, k]) == int(request_epochs[b])
        if not current or not int(state_valid_ranges[b, 0]) <= q < int(state_valid_ranges[b, 1]):
            return None
        return flat[page_id * page + (q % rows) % page]

    out = torch.zeros(x.shape[0], d, dtype=torch.float32)
    closes = torch.zeros(x.shape[0], dtype=torch.bool)
    for t in range(x.shape[0]):
        p, b = int(position_ids[t]), t // seq
        if (p + 1) % ratio:
            continue
        first = int(position_ids[b * seq])
        window = [(q, 0) for q in range(p - 2 * ratio + 1, p - ratio + 1)] if overlap else []
        window += [(q, d if overlap else 0) for q in range(p - ratio + 1, p + 1)]
        vals, scores = [], []
        for q, lo in window:
            row = own[b * seq + q - first] if first <= q <= p else (held(b, q) if q >= 0 else None)
            vals.append(row[lo:lo + d] if row is not None else torch.zeros(d))
            scores.append(row[w + lo:w + lo + d] if row is not None else torch.full((d,), float("-inf")))
        weight = torch.stack(scores).softmax(dim=0)
        pooled = (torch.stack(vals) * weight).sum(dim=0)
        out[t] = pooled * torch.rsqrt(pooled.pow(2).mean() + eps) * weights.norm.float()
        closes[t] = True
    new = flat.clone()
    for t in range(x.shape[0]):  # the commit, after every pool has read the old state
        slot = int(state_slot_mapping[t])
        if slot >= 0:
            new[slot] = own[t]
    return out, closes, new.reshape(pages, page, 2 * w)


NO_EVENT_RULES = ("skip", "zero_rope")


@operator(returns="the new compressed pool: each request's closed row rotated by its event's RoPE "
                   "rows, written at its slot; no event: nothing (or, no_event='zero_rope', the "
                   'RoPE dims 0)',
          spec='§8')
def v4_publish_events(compressed: torch.Tensor, closes: torch.Tensor, cmp_slot_mapping: torch.Tensor,
                      cmp_pool: torch.Tensor, request_event_indices: torch.Tensor, event_cos: torch.Tensor,
                      event_sin: torch.Tensor, *, seq: int, no_event: str = "skip") -> torch.Tensor:
    """Publish each request's closed row through its event (module doc): compressed [B·seq, d] FP32 and closes
    [B·seq] from ``v4_compressor_txn``, cmp_slot_mapping [B·seq], cmp_pool [blocks, page, 1, d] -> the new pool
    (the input is not modified). Spec: §8."""
    from kernels.reference.rope import rope_interleave

    if no_event not in NO_EVENT_RULES:
        raise ContractInputError("no_event", None, f"one of {NO_EVENT_RULES}", repr(no_event), SPEC)
    if compressed.dtype != torch.float32:
        raise ContractInputError("compressed", None, "the FP32 rows of v4_compressor_txn (a BF16 row would round "
                                 "twice)", str(compressed.dtype), SPEC)
    tokens, d = compressed.shape
    requests = tokens // seq
    if tokens % seq or tuple(closes.shape) != (tokens,) or tuple(cmp_slot_mapping.shape) != (tokens,):
        raise ContractInputError("closes/cmp_slot_mapping", None, f"[{tokens}] each, {seq} rows a request",
                                 [list(closes.shape), list(cmp_slot_mapping.shape)], SPEC)
    if tuple(request_event_indices.shape) != (requests,):
        raise ContractInputError("request_event_indices", None, f"[{requests}] (one entry a request)",
                                 list(request_event_indices.shape), SPEC)
    if event_cos.ndim != 2 or event_cos.shape != event_sin.shape:
        raise ContractInputError("event_cos/event_sin", None, "[E, rope/2] each",
                                 [list(event_cos.shape), list(event_sin.shape)], SPEC)
    if cmp_pool.ndim != 4 or cmp_pool.shape[2] != 1 or cmp_pool.shape[3] != d:
        raise ContractInputError("cmp_pool", None, f"[blocks, page, 1, {d}]", list(cmp_pool.shape), SPEC)
    events = event_cos.shape[0]
    pool = cmp_pool.clone()
    flat = pool.reshape(-1, d)
    for b in range(requests):
        e = int(request_event_indices[b])
        if not -1 <= e < events:
            raise ContractInputError("request_event_indices", (b,), f"-1 or an event in [0, {events})", e, SPEC)
        closing = closes[b * seq:(b + 1) * seq].nonzero().flatten().tolist()
        if not closing:
            continue
        t = b * seq + closing[0]  # upstream writes the request's first closing row
        slot = int(cmp_slot_mapping[t])
        if slot < 0:
            continue
        if slot >= flat.shape[0]:
            raise ContractInputError("cmp_slot_mapping", (t,), f"a row in [0, {flat.shape[0]})", slot, SPEC)
        if e < 0 and no_event == "skip":
            continue
        cos, sin = (event_cos[e:e + 1], event_sin[e:e + 1]) if e >= 0 else \
            (torch.zeros(1, event_cos.shape[1]), torch.zeros(1, event_cos.shape[1]))
        flat[slot] = rope_interleave(compressed[t:t + 1], cos.float(), sin.float())[0].to(pool.dtype)
    return pool
