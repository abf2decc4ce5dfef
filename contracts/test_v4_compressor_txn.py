"""V4's decode compressors as a state transaction (``v4_compressor_txn``): page ids, page epochs, request epochs
and valid ranges decide which ring rows a window may read; this step's rows overlay the state; the commit comes
after the pooling.

Ownership contracts: with every page current it is the paged ring of ``v4_compressor`` bit for bit over a long
run; a page whose epoch is not the request's (recycled) is never read; positions outside the valid range take no
part; this step's own rows come from its projections whatever the state holds; a token committing onto a ring
row the window still reads does so only after the pool. Judged against an FP64 evaluation written here on
inputs that separate each rule from the port that drops it.

Spec: §8; docs/coverage.md, V4 section (V4-11, V4-12).
"""

from __future__ import annotations

import pytest
import torch

from backends import torch_backend
from contracts.separation import separates, separates_under
from kernels.errors import ContractInputError
from kernels.v4.compressor import V4CompressorWeights
from pto_pytest.defect import shared
from pto_pytest.plugin import op

HIDDEN, D, SEQ = 32, 8, 2
PAGE = {4: 2, 128: 8}  # upstream's persistent ABI: 2-row CSA pages (4 per request), 8-row HCA pages (16)


def _weights(ratio, seed=0):
    g = torch.Generator().manual_seed(seed)
    c = (2 if ratio == 4 else 1) * D
    return V4CompressorWeights(torch.randn(HIDDEN, c, generator=g) / HIDDEN**0.5,
                               torch.randn(HIDDEN, c, generator=g) / HIDDEN**0.5,
                               torch.randn(ratio, c, generator=g) * 0.5, torch.rand(D, generator=g) + 0.5)


def _setup(ratio, requests=2, seed=1):
    """Per request its ring pages (reversed physical ids, interleaved between requests), epochs 17 + b, a pool
    of random FP32 rows (what earlier steps left)."""
    g = torch.Generator().manual_seed(seed)
    page = PAGE[ratio]
    rows = 2 * ratio if ratio == 4 else ratio
    per = rows // page
    ids = torch.arange(requests * per - 1, -1, -1, dtype=torch.int32).reshape(per, requests).T.contiguous()
    epochs = torch.arange(requests, dtype=torch.int32) + 17
    pool = torch.randn(requests * per + 1, page, 2 * (2 if ratio == 4 else 1) * D, generator=g)
    return ids, epochs[:, None].expand(requests, per).clone(), epochs, pool


def _slots(pos, ids, ratio):
    page, rows = PAGE[ratio], (2 * ratio if ratio == 4 else ratio)
    return torch.tensor([int(ids[t // SEQ, (q % rows) // page]) * page + (q % rows) % page
                         for t, q in enumerate(pos.tolist())])


def _step(backend, x, pos, ids, page_epochs, epochs, ranges, slots, pool, w, ratio):
    return op(backend, "v4_compressor_txn")(x, pos, ids, page_epochs, epochs, ranges, slots, pool, w, ratio=ratio,
                                            seq=SEQ)


def _independent(x, pos, ids, page_epochs, epochs, ranges, pool, w, ratio):
    """FP64, written apart: for each closing row, each window position from this step's projection if the
    request's step covers it, else from its ring row when the page is current and the range holds it, else no
    part; softmax per channel, RMS-normalised times the weight."""
    overlap, page = ratio == 4, PAGE[ratio]
    rows, width = (2 * ratio if overlap else ratio), (2 if overlap else 1) * D
    kv, sc = x.double() @ w.wkv.double(), x.double() @ w.wgate.double()
    flat = pool.double().reshape(-1, 2 * width)
    out = torch.zeros(x.shape[0], D, dtype=torch.float64)
    for t in range(x.shape[0]):
        p, b = int(pos[t]), t // SEQ
        if (p + 1) % ratio:
            continue
        first = int(pos[b * SEQ])
        spans = ([(q, 0) for q in range(p - 2 * ratio + 1, p - ratio + 1)] if overlap else []) + \
            [(q, D if overlap else 0) for q in range(p - ratio + 1, p + 1)]
        vals, scores = [], []
        for q, lo in spans:
            if first <= q <= p:
                i = b * SEQ + q - first
                v, s = kv[i, lo:lo + D], sc[i, lo:lo + D] + w.ape[q % ratio, lo:lo + D].double()
            else:
                k = (q % rows) // page
                if q < 0 or int(ids[b, k]) < 0 or int(page_epochs[b, k]) != int(epochs[b]) or \
                        not int(ranges[b, 0]) <= q < int(ranges[b, 1]):
                    continue
                row = flat[int(ids[b, k]) * page + (q % rows) % page]
                v, s = row[lo:lo + D], row[width + lo:width + lo + D]
            vals.append(v)
            scores.append(s)
        pooled = (torch.stack(vals) * torch.stack(scores).softmax(0)).sum(0)
        out[t] = pooled / torch.sqrt(pooled.pow(2).mean() + 1e-6) * w.norm.double()
    return out


def _close(got, want, rows):
    err = float(((got.double() - want).abs()[rows]).max())
    assert err <= 1e-5, f"compressed rows {rows} differ from the FP64 evaluation by {err:.3g}"


@pytest.mark.whole_backend("a stage against its own parts, bit for bit")
@pytest.mark.parametrize("ratio, steps", [(4, 24), (128, 140)], ids=["ratio4", "ratio128"])
@pytest.mark.operators("v4_compressor", "v4_compressor_txn")
def test_with_every_page_current_it_is_the_paged_ring(backend, ratio, steps):
    """Two requests decoding SEQ = 2 rows a step from positions 0 and 3 (so each closes windows at different
    phases), every page current and the valid range the ring's last ``rows`` positions: every step's compressed
    rows and the whole state pool equal v4_compressor's on the same ring (its table naming the same pages for
    every logical block), bit for bit. Spec: §8."""
    w = _weights(ratio)
    ids, page_epochs, epochs, pool = _setup(ratio)
    page, rows = PAGE[ratio], (2 * ratio if ratio == 4 else ratio)
    per = ids.shape[1]
    blocks = -(-(2 * steps + 3 + rows) // page)
    table = torch.stack([ids[b, torch.arange(blocks) % per] for b in range(2)]).to(torch.int32)
    ring_pool, txn_pool = pool.clone(), pool.clone()
    g = torch.Generator().manual_seed(2)
    closed = 0
    for step in range(steps):
        pos = torch.tensor([2 * step + j for j in range(SEQ)] + [3 + 2 * step + j for j in range(SEQ)])
        x = torch.randn(2 * SEQ, HIDDEN, generator=g).to(torch.bfloat16)
        ranges = torch.tensor([[max(0, int(pos[b * SEQ]) - rows), int(pos[b * SEQ])] for b in range(2)])
        out, closes, txn_pool = _step(backend, x, pos, ids, page_epochs, epochs, ranges, _slots(pos, ids, ratio),
                                      txn_pool, w, ratio)
        want, want_closes, ring_pool = op(backend, "v4_compressor")(x, pos, torch.arange(2 * SEQ) // SEQ, table,
                                                                    ring_pool, w, ratio=ratio, overlap=ratio == 4)
        assert torch.equal(closes, want_closes) and torch.equal(out, want), f"step {step}: compressed rows differ"
        assert torch.equal(txn_pool, ring_pool), f"step {step}: state pools differ"
        closed += int(closes.sum())
    assert closed >= 2, "the run closes no window"


def _one_step(ratio=4, first=(14, 6)):
    """One decode step of two requests at positions (first[0], +1) and (first[1], +1), every page current, the
    valid range the ring's last rows before each request's first position."""
    ids, page_epochs, epochs, pool = _setup(ratio, seed=5)
    pos = torch.tensor([first[0], first[0] + 1, first[1], first[1] + 1])
    x = torch.randn(4, HIDDEN, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    rows = 2 * ratio if ratio == 4 else ratio
    ranges = torch.tensor([[max(0, f - rows), f] for f in first])
    return x, pos, ids, page_epochs, epochs, ranges, pool


@pytest.mark.operators("v4_compressor_txn")
def test_a_page_of_another_epoch_is_never_read(backend):
    """Request 0 closes the window of position 15 (positions 8 .. 15: 8 .. 13 from its ring, 14 and 15 from this
    step); its ring page holding positions 10 and 11 carries another epoch (recycled): those positions take no
    part. The compressed row matches the FP64 evaluation that drops them and differs from the all-current one.
    Spec: §8."""
    w = _weights(4)
    x, pos, ids, page_epochs, epochs, ranges, pool = _one_step(first=(14, 6))
    slots = _slots(pos, ids, 4)
    current = _step(backend, x, pos, ids, page_epochs, epochs, ranges, slots, pool, w, 4)[0]
    stale = page_epochs.clone()
    stale[0, (10 % 8) // 2] = 3  # the page of ring rows 2, 3 (positions 10, 11)
    out = _step(backend, x, pos, ids, stale, epochs, ranges, slots, pool, w, 4)[0]
    t = 1  # position 15
    _close(out, _independent(x, pos, ids, stale, epochs, ranges, pool, w, 4), [t])
    assert not torch.equal(out[t], current[t]), "the stale page made no difference: the case does not separate"
    assert torch.equal(out[3], current[3]), "request 1 read request 0's page epochs"


@pytest.mark.parametrize("begin, end", [(12, 14), (8, 12), (0, 1 << 20)],
                         ids=["state-before-12-gone", "state-from-12-not-valid", "valid-past-the-step"])
@pytest.mark.operators("v4_compressor_txn")
def test_positions_outside_the_valid_range_take_no_part(backend, begin, end):
    """The window 8 .. 15 of request 0 (14 and 15 from this step) with the valid range [begin, end): positions of
    the ring outside it take no part (the state before 12 gone; the state from 12 on not valid yet), and a range
    reaching past the step never lets the window read past its closing position (position 16 would sit on
    position 8's ring row). Spec: §8."""
    w = _weights(4)
    x, pos, ids, page_epochs, epochs, ranges, pool = _one_step(first=(14, 6))
    ranges = ranges.clone()
    ranges[0] = torch.tensor([begin, end])
    out = _step(backend, x, pos, ids, page_epochs, epochs, ranges, _slots(pos, ids, 4), pool, w, 4)[0]
    want = _independent(x, pos, ids, page_epochs, epochs, ranges, pool, w, 4)
    _close(out, want, [1])

    def within(candidate, expected) -> bool:  # the bound _close applies
        return float((candidate.double() - expected).abs()[[1]].max()) <= 1e-5

    # the range's own window, separated from the ring's whole last window (the range ignored) and, for a range
    # reaching past the step, from the window read one position further (position 16 on position 8's ring row)
    alternatives = {"range_ignored": _independent(x, pos, ids, page_epochs, epochs, torch.tensor([[6, 14], [0, 6]]),
                                                  pool, w, 4)} if end < 1 << 20 else {
        "read_past_the_closing_position": _independent(x, pos + (pos >= 14).to(pos.dtype), ids, page_epochs, epochs,
                                                       ranges, pool, w, 4)}
    separates_under("§8 the valid range bounds the window", within, want, **alternatives)


@pytest.mark.operators("v4_compressor_txn")
def test_this_steps_rows_overlay_the_state(backend):
    """Request 1 at positions 6, 7 closes the window 0 .. 7; its ring rows of 6 and 7 hold garbage and the valid
    range ends at 6: the window takes 6 and 7 from this step's projections, never from the state.
    Spec: §8."""
    w = _weights(4)
    x, pos, ids, page_epochs, epochs, ranges, pool = _one_step(first=(14, 6))
    pool = pool.clone()
    flat = pool.reshape(-1, pool.shape[-1])
    for q in (6, 7):
        flat[int(ids[1, (q % 8) // 2]) * 2 + (q % 8) % 2] = 1e3
    out = _step(backend, x, pos, ids, page_epochs, epochs, ranges, _slots(pos, ids, 4), pool, w, 4)[0]
    _close(out, _independent(x, pos, ids, page_epochs, epochs, ranges, pool, w, 4), [3])


@pytest.mark.operators("v4_compressor_txn")
def test_the_commit_comes_after_the_pool(backend):
    """Request 0 at positions 15, 16: position 15 closes the window 8 .. 15 and position 16 commits onto ring
    row 0 -- the row of position 8, which that window reads. The pool sees position 8's old row; the commit
    lands afterwards (the row holds position 16's projections on return). Spec: §8."""
    w = _weights(4)
    x, pos, ids, page_epochs, epochs, ranges, pool = _one_step(first=(15, 6))
    slots = _slots(pos, ids, 4)
    out, _closes, new = _step(backend, x, pos, ids, page_epochs, epochs, ranges, slots, pool, w, 4)
    _close(out, _independent(x, pos, ids, page_epochs, epochs, ranges, pool, w, 4), [0])
    row = int(slots[1])
    assert row == int(ids[0, 0]) * 2, "position 16 does not commit onto position 8's ring row"
    kv, sc = (x[1:2].double() @ w.wkv.double()).float(), (x[1:2].double() @ w.wgate.double()).float()
    want_row = torch.cat((kv[0], sc[0] + w.ape[0]))
    assert torch.equal(new.reshape(-1, new.shape[-1])[row], want_row), "position 16's commit is missing"


@pytest.mark.operators("v4_compressor_txn")
def test_a_token_without_a_state_slot_commits_nothing(backend):
    """state_slot_mapping -1 leaves the pool's bytes; every other row commits its own projections only.
    Spec: §8."""
    w = _weights(4)
    x, pos, ids, page_epochs, epochs, ranges, pool = _one_step(first=(14, 6))
    slots = _slots(pos, ids, 4)
    slots[2] = -1
    new = _step(backend, x, pos, ids, page_epochs, epochs, ranges, slots, pool, w, 4)[2]
    flat, before = new.reshape(-1, new.shape[-1]), pool.reshape(-1, pool.shape[-1])
    touched = {int(s) for s in slots.tolist() if s >= 0}
    for r in range(flat.shape[0]):
        if r not in touched:
            assert torch.equal(flat[r], before[r]), f"state row {r} written without a slot"


@pytest.mark.parametrize("field, change, needle", [
    ("state_slot_mapping", lambda a: a["state_slot_mapping"].flip(0), "ring row of position"),
    ("state_valid_ranges", lambda a: torch.tensor([[9, 3], [0, 6]]), "begin <= end"),
    ("position_ids", lambda a: torch.tensor([14, 16, 6, 7]), "consecutive positions"),
    ("state_page_ids", lambda a: a["state_page_ids"][:, :3], "pages of 2 rows"),
    ("request_epochs", lambda a: a["request_epochs"][:1], "[2]"),
    ("state_slot_mapping", lambda a: torch.where(torch.arange(4) == 0, 0, a["state_slot_mapping"]),
     "state_slot_mapping[0]: expected -1 or 2 (ring row of position 14), got 0"),
    ("state_pool", None, "FP32 [pages, page, 32]"),
])
@pytest.mark.operators("v4_compressor_txn")
def test_bad_inputs_name_the_field(backend, field, change, needle):
    w = _weights(4)
    x, pos, ids, page_epochs, epochs, ranges, pool = _one_step(first=(14, 6))
    a = dict(position_ids=pos, state_page_ids=ids, state_page_epochs=page_epochs, request_epochs=epochs,
             state_valid_ranges=ranges, state_slot_mapping=_slots(pos, ids, 4))
    if field == "state_pool":
        pool = pool.double()
    else:
        a[field] = change(a)
    with pytest.raises(ContractInputError) as exc:
        op(backend, "v4_compressor_txn")(x, a["position_ids"], a["state_page_ids"], a["state_page_epochs"],
                                         a["request_epochs"], a["state_valid_ranges"], a["state_slot_mapping"],
                                         pool, w, ratio=4, seq=SEQ)
    assert field in str(exc.value) and needle in str(exc.value), str(exc.value)


@pytest.mark.operators("v4_compressor_txn")
def test_a_gap_is_named_by_its_request(backend):
    """Three rows a request: a gap inside request 1's rows names request 1. Spec: §8."""
    w = _weights(4)
    _ids, _pe, _e, pool = _setup(4, seed=5)
    ids = torch.arange(8, dtype=torch.int32).reshape(2, 4)
    pos = torch.tensor([4, 5, 6, 9, 10, 12])
    x = torch.zeros(6, HIDDEN, dtype=torch.bfloat16)
    with pytest.raises(ContractInputError) as exc:
        op(backend, "v4_compressor_txn")(x, pos, ids, torch.zeros(2, 4, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
                                         torch.tensor([[0, 4], [0, 9]]), torch.full((6,), -1), pool, w, ratio=4, seq=3)
    assert exc.value.field == "position_ids" and exc.value.index == (1,), str(exc.value)


def _event_step(backend):
    """One ratio-4 step of three requests at positions (4, 5), (2, 3) and (7, 8): the first closes no window, the
    second closes on its second row, the third on its first; a BF16 compressed pool of random rows, a slot for
    every closing row (slot 0 among them)."""
    w = _weights(4, 3)
    ids, page_epochs, epochs, pool = _setup(4, requests=3, seed=4)
    pos = torch.tensor([4, 5, 2, 3, 7, 8])
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, HIDDEN, generator=g).to(torch.bfloat16)
    ranges = torch.tensor([[0, 4], [0, 2], [0, 7]])
    out, closes, _ = _step(backend, x, pos, ids, page_epochs, epochs, ranges, _slots(pos, ids, 4), pool, w, 4)
    assert closes.tolist() == [False, False, False, True, True, False]
    cmp_pool = (torch.rand(3, 4, 1, D, generator=g) - 0.5).to(torch.bfloat16)
    slots = torch.tensor([-1, -1, -1, 0, 9, -1])
    return pos, out, closes, slots, cmp_pool, g


@pytest.mark.operators("v4_compressor_txn", "v4_publish_compressed", "v4_publish_events")
def test_an_event_publishes_its_requests_row_with_the_events_rope_rows(backend):
    """The event list (request_event_indices [B], event_cos / event_sin [E, rope/2]): with each request's event
    holding the table row of its window's first position, v4_publish_events writes what v4_publish_compressed
    writes from the table, bit for bit -- with the events listed in the other order than the requests (request 0
    -> event 1, request 1 -> event 0), so the event a request names is the one used, not its rank among the
    closing requests. The first request, with no closing row, writes nothing although it names an event; event
    index 2 of three events is valid. Spec: §8."""
    pos, out, closes, slots, cmp_pool, g = _event_step(backend)
    rope = 2
    cos, sin = torch.rand(16, rope, generator=g), torch.rand(16, rope, generator=g)
    want = op(backend, "v4_publish_compressed")(out, closes, pos, slots, cmp_pool, cos, sin, ratio=4)
    first = {1: 3 - 3, 2: 7 - 3}  # each closing request's window first position
    spare = torch.rand(1, rope, generator=g)  # event 1: named by no closing request
    event_cos = torch.cat((cos[first[2]][None], spare, cos[first[1]][None]))
    event_sin = torch.cat((sin[first[2]][None], spare, sin[first[1]][None]))
    got = op(backend, "v4_publish_events")(out, closes, slots, cmp_pool, torch.tensor([1, 2, 0]), event_cos, event_sin,
                                           seq=SEQ)
    assert got.dtype == cmp_pool.dtype and torch.equal(got.view(torch.int16), want.view(torch.int16)), \
        "the event's rows did not publish the request's row"
    assert not torch.equal(want, cmp_pool), "nothing was published"
    # the event a request names, separated from the closing requests' rank order (request 1 -> event 0, 2 -> 1)
    ref = torch_backend().get("v4_publish_events")  # the rule and its alternative, on the reference
    separates("§8 a request publishes with the event it names",
              ref(out, closes, slots, cmp_pool, torch.tensor([1, 2, 0]), event_cos, event_sin, seq=SEQ).view(torch.int16),
              closing_rank_order=ref(out, closes, slots, cmp_pool, torch.tensor([1, 0, 1]), event_cos, event_sin,
                                     seq=SEQ).view(torch.int16))


@pytest.mark.operators("v4_compressor_txn", "v4_publish_events")
def test_a_request_without_an_event_publishes_nothing_under_the_current_rule(backend):
    """Request 1 names no event (-1) though its closing row has a slot: under the current rule (upstream's
    golden, no_event="skip") its slot keeps its bytes -- request 0, closing nothing, names an event but must not
    publish its neighbour's row -- and request 2 still publishes; under upstream's kernel
    variant (no_event="zero_rope") the row is written with its RoPE dims exactly 0 and the rest rounded once.
    Spec: §8."""
    pos, out, closes, slots, cmp_pool, g = _event_step(backend)
    event_cos, event_sin = torch.rand(1, 2, generator=g), torch.rand(1, 2, generator=g)
    publish = op(backend, "v4_publish_events")
    got = publish(out, closes, slots, cmp_pool, torch.tensor([0, -1, 0]), event_cos, event_sin, seq=SEQ)
    flat, before = got.reshape(-1, D), cmp_pool.reshape(-1, D)
    assert torch.equal(flat[0].view(torch.int16), before[0].view(torch.int16)), "a request without an event wrote"
    assert not torch.equal(flat[9], before[9]), "the request with an event did not publish"
    events, ref = torch.tensor([0, -1, 0]), torch_backend().get("v4_publish_events")
    separates("§8 no event publishes nothing (the current rule)",
              ref(out, closes, slots, cmp_pool, events, event_cos, event_sin, seq=SEQ).view(torch.int16),
              zero_rope=ref(out, closes, slots, cmp_pool, events, event_cos, event_sin, seq=SEQ,
                            no_event="zero_rope").view(torch.int16),
              event_zero_by_default=ref(out, closes, slots, cmp_pool, events.clamp(min=0), event_cos, event_sin,
                                        seq=SEQ).view(torch.int16))
    kernel = publish(out, closes, slots, cmp_pool, torch.tensor([-1, -1, 0]), event_cos, event_sin, seq=SEQ,
                     no_event="zero_rope")
    row = kernel.reshape(-1, D)[0]
    assert torch.equal(row[:D - 4], out[3, :D - 4].to(torch.bfloat16)) and not bool(row[D - 4:].any()), \
        "the kernel variant writes the row with RoPE dims 0"


@pytest.mark.parametrize("field, change, needle", [
    ("request_event_indices", lambda a: {**a, "events": torch.tensor([0, 3, -1])}, r"request_event_indices\[1\]"),
    ("request_event_indices", lambda a: {**a, "events": torch.tensor([-2, 0, 0])}, r"request_event_indices\[0\]"),
    ("request_event_indices", lambda a: {**a, "events": torch.tensor([0, 0])}, "request_event_indices"),
    ("event_cos", lambda a: {**a, "cos": a["cos"][:, :1]}, "event_cos"),
    ("no_event", lambda a: {**a, "no_event": "zero"}, "no_event"),
    ("compressed", lambda a: {**a, "out": a["out"].to(torch.bfloat16)}, "compressed"),
    ("cmp_slot_mapping", lambda a: {**a, "slots": torch.tensor([-1, -1, -1, 12, 9, -1])}, r"cmp_slot_mapping\[3\]"),
    ("cmp_pool", lambda a: {**a, "pool": a["pool"][:, :, 0]}, "cmp_pool"),
    ("closes", lambda a: {**a, "out": a["out"][:5], "closes": a["closes"][:5], "slots": a["slots"][:5]},
     "closes/cmp_slot_mapping"),
])
@pytest.mark.operators("v4_compressor_txn", "v4_publish_events")
def test_bad_event_inputs_name_the_field(backend, field, change, needle):
    """Three events (E = 3, rope/2 = 2): index 3 and -2 refused, one entry a request, matching tables, a known
    no_event rule, FP32 rows, a slot inside the 12-row pool, a 4-D pool, whole requests. Spec: §8."""
    pos, out, closes, slots, cmp_pool, g = _event_step(backend)
    a = change({"out": out, "closes": closes, "slots": slots, "events": torch.tensor([1, 0, -1]),
                "cos": torch.rand(3, 2), "sin": torch.rand(3, 2), "no_event": "skip", "pool": cmp_pool})
    with pytest.raises(ContractInputError, match=needle):
        op(backend, "v4_publish_events")(a["out"], a["closes"], a["slots"], a["pool"], a["events"], a["cos"], a["sin"],
                                         seq=SEQ, no_event=a["no_event"])


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("v4:TXN_EPOCH_IGNORED", "test_a_page_of_another_epoch_is_never_read", "differ from the FP64 evaluation"),
    shared("v4:TXN_RANGE_IGNORED", "test_positions_outside_the_valid_range_take_no_part", "differ from the FP64 evaluation"),
    shared("v4:TXN_NO_OVERLAY", "test_this_steps_rows_overlay_the_state", "differ from the FP64 evaluation"),
    shared("v4:TXN_COMMIT_FIRST", "test_the_commit_comes_after_the_pool", "differ from the FP64 evaluation"),
    shared("v4:EVENTS_IN_REQUEST_ORDER", "test_an_event_publishes_its_requests_row_with_the_events_rope_rows", "the event's rows did not publish"),
    shared("v4:EVENT_MISSING_WRITTEN", "test_a_request_without_an_event_publishes_nothing_under_the_current_rule", "a request without an event wrote"),
]
