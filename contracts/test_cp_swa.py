"""V4-Flash's context-parallel SWA prefill: the plan that lowers every rank's windows onto its ring and the two
overlays (``cp_swa_plan``), and the sublayer computed rank by rank (``prefill_cp_swa``). Judged against the unsplit
prefill: each window key resolved through the plan's own tables must be the position the window names (checked
with the ring's page formula written here), and the ranks' outputs must be the unsplit SWA stage's rows, the rings
the unsplit cache's last window. Golden case and bad calls: the records in ``kernels/v4/cp_swa.py``. Spec: §7.1,
§8."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from contracts.compare import COMPARATORS, Context
from contracts.separation import separates
from contracts.v4_inputs import cp_unsplit_window
from kernels.config import V4_FLASH_TINY
from kernels.errors import ContractInputError
from kernels.v4.cp_swa import PLAN_NAMES, TAIL_NAMES, WEIGHT_NAMES, chunk_inputs
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

C = V4_FLASH_TINY
R = C.sliding_window


def _ring_row(p: int, table: list[int], bs: int) -> int:
    """Written from the rule: the ring holds len(table) pages; position p sits in ring row p mod (pages x bs)."""
    ring = len(table) * bs
    return table[(p % ring) // bs] * bs + p % bs


@pytest.mark.operators("cp_swa_plan")
@given(cp=st.sampled_from([2, 4]), span=st.integers(R, 2 * R), fill=st.floats(0.0, 1.0),
       prefix=st.integers(0, 400), pages=st.integers(1, 3), seed=st.integers(0, 2**16))
@example(cp=2, span=R, fill=1.0, prefix=0, pages=1, seed=0)  # every segment full: the last one is no one's pred
def test_the_plan_lowers_every_window_key_to_its_row(backend, cp, span, fill, prefix, pages, seed):
    """Any chunk, prefix and ring: every chunk position is one query row of one (rank, part, tile); a query at q has
    column c valid exactly when its key q - R + 1 + c is >= 0, and each valid index resolves -- a ring row through
    the page formula, an overlay row through ``overlay_position_ids`` -- to that key; the decode window's slots are
    its positions' ring rows."""
    n = max(1, round(fill * 2 * cp * span))
    table = torch.randperm(pages, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
    plan = op(backend, "cp_swa_plan")(n, cp, span, table, prefix=prefix, config=C)
    bs, ring, tl = C.block_size, pages * C.block_size, table.tolist()
    qpos, req = plan["query_position_ids"], plan["query_token_to_request"]
    seen = sorted(int(p) for p in qpos[req >= 0])
    assert seen == list(range(prefix, prefix + n)), \
        f"the ranks' query rows hold {len(seen)} positions, not {prefix} .. {prefix + n - 1} once each (§7.1)"
    idx, ovp = plan["swa_indices"], plan["overlay_position_ids"]
    idle = idx[req < 0]
    assert bool((idle == -1).all()), f"{int((idle != -1).any(-1).sum())} rows without a query list a window key"
    for where in (req >= 0).nonzero().tolist():
        q = int(qpos[tuple(where)])
        row = idx[tuple(where)].tolist()
        for c, raw in enumerate(row):
            key = q - R + 1 + c
            if key < 0:
                assert raw == -1, f"swa_indices{tuple(where)}[{c}] = {raw}: key {key} is before position 0 (-1)"
                continue
            if raw < 0:
                raise AssertionError(f"swa_indices{tuple(where)}[{c}] = -1: key {key} of query {q} is in the "
                                     f"window and must be reachable (cp {cp}, span {span}, prefix {prefix})")
            if raw < ring:
                assert key < prefix and raw == _ring_row(key, tl, bs), \
                    f"swa_indices{tuple(where)}[{c}] = ring row {raw}; key {key} of query {q} is " + \
                    (f"ring row {_ring_row(key, tl, bs)}" if key < prefix else "in the chunk (an overlay row)")
            else:
                named = int(ovp[tuple(where[:3])][raw - ring])
                assert named == key, f"swa_indices{tuple(where)}[{c}] = overlay row {raw - ring}, which names " \
                                     f"position {named}; key {key} of query {q} (prefix {prefix}, ring {ring})"
    _check_tables(plan, n, cp, span, prefix)
    for j in range(R):
        p = prefix + n - R + j
        slot = int(plan["final_slot_mapping"][j])
        assert slot == (_ring_row(p, tl, bs) if p >= prefix else -1), \
            f"final_slot_mapping[{j}] = {slot}: position {p} goes to ring row {_ring_row(p, tl, bs)} " \
            f"({'in' if p >= prefix else 'before'} the chunk)"


def _check_tables(plan, n, cp, span, prefix):
    """Every table the kernel reads, from the rule written here: INT32 at its shape; the zigzag owners and their
    predecessors; each tile's positions, requests (0 on a query / overlay row, -1 elsewhere) and overlay sources
    (tile 0: the predecessor's last min(R, len) positions, none for segment 0; tile 1: the segment's tile 0;
    cur: the tile's own positions) and their counts."""
    shapes = {"segment_starts": (2 * cp,), "owner_segments": (cp, 2), "predecessor_segments": (cp, 2),
              "query_position_ids": (cp, 2, 2, R), "query_token_to_request": (cp, 2, 2, R),
              "overlay_position_ids": (cp, 2, 2, 2 * R), "overlay_token_to_request": (cp, 2, 2, 2 * R),
              "overlay_active_lengths": (cp, 2, 2, 2), "swa_indices": (cp, 2, 2, R, R), "final_win_seg_src": (R,),
              "final_win_row_src": (R,), "final_slot_mapping": (R,)}
    for name, shape in shapes.items():
        t = plan[name]
        assert t.dtype == torch.int32 and tuple(t.shape) == shape, \
            f"{name}: {t.dtype}{list(t.shape)}, expected int32{list(shape)} (the table the kernel reads)"
    lens = [min(max(n - s * span, 0), span) for s in range(2 * cp)]
    starts = [prefix + s * span for s in range(2 * cp)]
    assert plan["segment_starts"].tolist() == starts, f"segment_starts {plan['segment_starts'].tolist()}"
    for rank in range(cp):
        for part in range(2):
            s = rank if part == 0 else 2 * cp - 1 - rank
            assert int(plan["owner_segments"][rank, part]) == s and \
                int(plan["predecessor_segments"][rank, part]) == s - 1, \
                f"rank {rank} part {part}: segment {int(plan['owner_segments'][rank, part])}, predecessor " \
                f"{int(plan['predecessor_segments'][rank, part])}; expected {s} and {s - 1} (zigzag)"
            for tile in range(2):
                cur = starts[s] + tile * R
                active = max(0, min(lens[s] - tile * R, R))
                if tile == 0:
                    n_pred = min(R, lens[s - 1]) if s > 0 else 0
                    pred = list(range(starts[s - 1] + lens[s - 1] - n_pred, starts[s - 1] + lens[s - 1])) \
                        if n_pred else []
                else:
                    pred = list(range(starts[s], starts[s] + min(lens[s], R)))
                own = list(range(cur, cur + active))
                want_ov = pred + [-1] * (R - len(pred)) + own + [-1] * (R - active)
                got_ov = plan["overlay_position_ids"][rank, part, tile].tolist()
                assert got_ov == want_ov, f"overlay_position_ids[{rank}, {part}, {tile}] = {got_ov[:4]}.. " \
                                          f"{got_ov[R:R + 4]}.., expected {want_ov[:4]}.. {want_ov[R:R + 4]}.. " \
                                          "(pred source, then cur)"
                want_q = own + [0] * (R - active)
                assert plan["query_position_ids"][rank, part, tile].tolist() == want_q, \
                    f"query_position_ids[{rank}, {part}, {tile}]: expected {cur} .. for {active} rows, then 0"
                for name, named in (("query_token_to_request", own + [-1] * (R - active)),
                                    ("overlay_token_to_request", want_ov)):
                    got = plan[name][rank, part, tile].tolist()
                    assert got == [0 if p >= 0 else -1 for p in named], \
                        f"{name}[{rank}, {part}, {tile}]: 0 on a named row, -1 elsewhere"
                assert plan["overlay_active_lengths"][rank, part, tile].tolist() == [len(pred), active], \
                    f"overlay_active_lengths[{rank}, {part}, {tile}]: expected [{len(pred)}, {active}]"


@pytest.mark.operators("cp_swa_plan")
def test_a_window_key_lowers_by_the_rule_not_an_alternative(backend):
    """Hand vector: CP 2, span 200 (> R: a segment's tail starts inside it), 800 tokens. Segment 3 (rank 0, part 1)
    tile 0, row 2 is position 602; its columns R-1, R-4 and 0 name keys 602 (its own: cur overlay row 2), 599 and
    475 (segment 2's tail, which starts at 472: pred overlay rows 127 and 3). Separated from the unsplit ring row,
    the cur overlay without its R offset, the pred overlay counted from the segment's start, and newest-first
    columns."""
    table = torch.arange(1, dtype=torch.int32)
    plan = op(backend, "cp_swa_plan")(800, 2, 200, table, config=C)  # the default prefix: 0
    ring = C.block_size
    assert int(plan["query_position_ids"][0, 1, 0, 2]) == 602, "segment 3 starts at 3 x 200 (no prefix)"
    got = plan["swa_indices"][0, 1, 0, 2, [R - 1, R - 4, 0]].to(torch.int64)
    keys = torch.tensor([602, 599, 475])
    want = separates("keys lowered to the cur / pred overlays", torch.tensor([ring + R + 2, ring + 127, ring + 3]),
                     unsplit_ring_rows=keys % ring,
                     cur_without_offset=torch.tensor([ring + 2, ring + 127, ring + 3]),
                     pred_from_segment_start=torch.tensor([ring + R + 2, ring + 199, ring + 75]),
                     newest_first=torch.tensor([ring + 3, ring + 6, ring + R + 2]))
    assert torch.equal(got, want), f"swa_indices[0, 1, 0, 2, cols R-1, R-4, 0] = {got.tolist()}, expected " \
                                   f"{want.tolist()} (ring {ring} rows, then pred R rows, then cur R rows)"


LAYOUTS = {"full segments": (2, R, 4 * R, 0), "two tiles, short last": (2, 2 * R, 300, 5),
           "cp 4, prefix wrapping the ring": (4, R + 72, 5 * R + 9, 130)}


def _unsplit(backend, i, n, prefix):
    """The whole chunk as one request through the SWA prefill stage: a cache of the prefix's positions (read from
    the ring) and the chunk's, identity pages, the window from the chunk's positions."""
    cache, pos, pages = cp_unsplit_window(i, n, prefix, C)
    window = op(backend, "v4_prefill_swa_indices")(pos, torch.arange(pages, dtype=torch.int32), n, config=C)
    return op(backend, "v4_attention_stage")("SWA", i["x_all"][prefix:], **{k: i[k] for k in WEIGHT_NAMES},
                                             kv_cache=cache, swa_slot_mapping=pos.long(), window_indices=window,
                                             position_ids=pos, **{k: i[k] for k in TAIL_NAMES}, num_tokens=n,
                                             config=C)


def _cp(backend, i):
    return op(backend, "prefill_cp_swa")(i["x_hc"], *(i[k] for k in WEIGHT_NAMES), i["kv_cache"],
                                         *(i[k] for k in TAIL_NAMES), {k: i[k] for k in PLAN_NAMES}, config=C)


@pytest.mark.operators("prefill_cp_swa", "v4_attention_stage", "v4_prefill_swa_indices")
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_cp_sublayer_is_the_unsplit_prefills(backend, layout):
    """Every query row of every rank equals the unsplit prefill's row of its position, and every rank's ring holds
    the unsplit cache's last R positions at their ring rows and nothing else new (judged by the comparators the
    record names: upstream's own compare_fn bounds, the empty rows exactly 0 though their streams are not)."""
    cp, span, n, prefix = LAYOUTS[layout]
    i = chunk_inputs(C, 7, cp=cp, span=span, num_tokens=n, prefix=prefix, noisy_padding=True)
    got, whole = _cp(backend, i), _unsplit(backend, i, n, prefix)
    real = i["query_token_to_request"] >= 0
    want_x = torch.zeros_like(got["x_out"])
    want_x[real] = whole["x_out"][(i["query_position_ids"][real] - prefix).long()]
    hd, bs = C.head_dim, C.block_size
    want_kv = i["kv_cache"].clone()
    for j in range(R):
        p = prefix + n - R + j
        if p >= prefix:
            want_kv.reshape(cp, -1, hd)[:, _ring_row(p, i["block_table"].tolist(), bs)] = \
                whole["kv_cache"].reshape(-1, hd)[p]
    ctx = Context(inputs=i, actual_outputs=got, expected_outputs={"x_out": want_x, "kv_cache": want_kv}, params={})
    for name, judge, want in (("x_out", "v4_cp_x_out", want_x), ("kv_cache", "v4_cp_kv_cache", want_kv)):
        verdict = COMPARATORS[judge](name, got[name], want, ctx)
        assert verdict.ok, f"{layout}: {name} is not the unsplit prefill's ({judge}): {verdict}"


@pytest.mark.whole_backend("the CP split against the same backend's unsplit stage, bit for bit")
@pytest.mark.operators("prefill_cp_swa", "v4_attention_stage", "v4_prefill_swa_indices")
def test_the_split_changes_no_bit_on_one_backend(backend):
    """On one backend the split is data movement only: every query row's x_out and the rings' decode window are the
    unsplit stage's bytes (the window's columns sit elsewhere, its keys and their order are the same), with KV
    values that only BF16 (or FP32) carries unchanged."""
    cp, span, n, prefix = LAYOUTS["two tiles, short last"]
    i = chunk_inputs(C, 11, cp=cp, span=span, num_tokens=n, prefix=prefix)
    # KV channels past FP16's range and below its normals: a row staged in another dtype than BF16 shows
    i["gamma_ckv"] = i["gamma_ckv"].clone()
    i["gamma_ckv"][:4] = 2.0**17
    i["gamma_ckv"][4:8] = 2.0**-20
    got, whole = _cp(backend, i), _unsplit(backend, i, n, prefix)
    real = i["query_token_to_request"] >= 0
    rows = whole["x_out"][(i["query_position_ids"][real] - prefix).long()]
    assert torch.equal(got["x_out"][real], rows), "x_out of the split differs from the unsplit stage's rows"
    for j in range(R):
        slot = int(i["final_slot_mapping"][j])
        if slot >= 0:
            want = whole["kv_cache"].reshape(-1, C.head_dim)[prefix + n - R + j]
            assert all(torch.equal(got["kv_cache"][r].reshape(-1, C.head_dim)[slot], want) for r in range(cp)), \
                f"ring row {slot} (decode window row {j}) differs from the unsplit cache's"


def _plan_call(case):
    table = torch.arange(2, dtype=torch.int32)
    args = {"cp": (300, 2, R, table), "span short": (300, 2, R - 1, table), "span long": (300, 2, 2 * R + 1, table),
            "table 2-D": (300, 2, R, table.reshape(1, 2)), "table float": (300, 2, R, table.float()),
            "table empty": (300, 2, R, table[:0]), "page unmapped": (300, 2, R, torch.tensor([0, -1])),
            "tokens": (4 * R + 1, 2, R, table)}[case]
    if case == "cp":
        args = (300, 3, R, table)
    return args


@pytest.mark.operators("cp_swa_plan")
@pytest.mark.parametrize("case, field", [("cp", "cp"), ("span short", "span"), ("span long", "span"),
                                         ("table 2-D", "block_table"), ("table float", "block_table"),
                                         ("table empty", "block_table"), ("page unmapped", "block_table[1]"),
                                         ("tokens", "num_tokens")])
def test_a_plan_that_cannot_be_built_is_refused(backend, case, field):
    """A CP world not compiled, a span outside one or two tiles (R - 1, 2R + 1; R and 2R are built), a table that
    is not a 1-D integer table of mapped pages, more tokens than the segments hold: refused naming the field."""
    plan = op(backend, "cp_swa_plan")
    with pytest.raises(ContractInputError) as exc:
        plan(*_plan_call(case), config=C)
    named = exc.value.field + (f"[{', '.join(map(str, exc.value.index))}]" if exc.value.index else "")
    assert named == field, f"{case}: refused naming {named!r}, not {field!r}: {exc.value}"
    table = torch.arange(2, dtype=torch.int32)
    for span in (R, 2 * R):
        assert plan(300, 2, span, table, config=C)["swa_indices"].shape[-1] == R


def _bad_stage(i, case):
    i = dict(i)
    plan = {k: i[k] for k in PLAN_NAMES}
    ring = i["kv_cache"].shape[1] * C.block_size
    if case == "x_hc rank dims":
        i["x_hc"] = i["x_hc"][0]
    elif case == "x_hc BF16":
        i["x_hc"] = i["x_hc"].to(torch.bfloat16)
    elif case == "kv_cache FP32":
        i["kv_cache"] = i["kv_cache"].float()
    elif case == "kv_cache page":
        i["kv_cache"] = i["kv_cache"][:, :, :64].contiguous()
    elif case == "plan float":
        plan["swa_indices"] = plan["swa_indices"].float()
    elif case == "plan missing":
        del plan["final_slot_mapping"]
    elif case == "overlay count":
        plan["overlay_active_lengths"] = plan["overlay_active_lengths"].clone()
        plan["overlay_active_lengths"][0, 0, 0, 1] = R + 1
    elif case == "overlay negative":
        plan["overlay_active_lengths"] = plan["overlay_active_lengths"].clone()
        plan["overlay_active_lengths"][1, 1, 1, 0] = -1
    elif case == "index past the overlays":
        plan["swa_indices"] = plan["swa_indices"].clone()
        plan["swa_indices"][0, 0, 0, 0, -1] = ring + 2 * R
    elif case == "index below -1":
        plan["swa_indices"] = plan["swa_indices"].clone()
        plan["swa_indices"][0, 0, 0, 0, 0] = -2
    elif case == "slot past the ring":
        plan["final_slot_mapping"] = plan["final_slot_mapping"].clone()
        plan["final_slot_mapping"][-1] = ring
    elif case == "slot below -1":
        plan["final_slot_mapping"] = plan["final_slot_mapping"].clone()
        plan["final_slot_mapping"][0], plan["final_slot_mapping"][5] = -1, -2
    return i, plan


@pytest.mark.operators("prefill_cp_swa")
@pytest.mark.parametrize("case, field", [
    ("x_hc rank dims", "x_hc"), ("x_hc BF16", "x_hc"), ("kv_cache FP32", "kv_cache"), ("kv_cache page", "kv_cache"),
    ("plan float", "plan.swa_indices"), ("plan missing", "plan"),
    ("overlay count", "plan.overlay_active_lengths[0, 0, 0, 1]"),
    ("overlay negative", "plan.overlay_active_lengths[1, 1, 1, 0]"),
    ("index past the overlays", "plan.swa_indices[0, 0, 0, 0, 127]"),
    ("index below -1", "plan.swa_indices[0, 0, 0, 0, 0]"), ("slot past the ring", "plan.final_slot_mapping[127]"),
    ("slot below -1", "plan.final_slot_mapping[5]")])
def test_a_malformed_sublayer_call_is_refused_naming_its_field(backend, case, field):
    """Each malformed piece of the call refused naming it (the ring's last row and the overlays' last row are
    accepted: the well-formed call runs)."""
    cp, span, n, prefix = LAYOUTS["full segments"]
    i = chunk_inputs(C, 3, cp=cp, span=span, num_tokens=n, prefix=prefix)
    bad, plan = _bad_stage(i, case)
    with pytest.raises(ContractInputError) as exc:
        op(backend, "prefill_cp_swa")(bad["x_hc"], *(bad[k] for k in WEIGHT_NAMES), bad["kv_cache"],
                                      *(bad[k] for k in TAIL_NAMES), plan, config=C)
    named = exc.value.field + (f"[{', '.join(map(str, exc.value.index))}]" if exc.value.index else "")
    assert named == field, f"{case}: refused naming {named!r}, not {field!r}: {exc.value}"


@pytest.mark.operators("prefill_cp_swa")
def test_the_last_ring_row_and_the_last_overlay_row_are_accepted(backend):
    """The bounds the refusals draw are the last rows themselves: a window index of the cur overlay's last row and
    a decode-window slot of the ring's last row are a well-formed call (the rows are read and written); a slot of
    -1 writes nothing, whatever its source names."""
    cp, span, n, prefix = LAYOUTS["full segments"]
    i = chunk_inputs(C, 3, cp=cp, span=span, num_tokens=n, prefix=prefix)
    plan = {k: i[k] for k in PLAN_NAMES}
    ring = i["kv_cache"].shape[1] * C.block_size
    assert int(plan["swa_indices"].max()) == ring + 2 * R - 1, "the chunk reaches the cur overlay's last row"
    plan["final_slot_mapping"] = plan["final_slot_mapping"].clone()
    plan["final_slot_mapping"][-1] = ring - 1
    out = op(backend, "prefill_cp_swa")(i["x_hc"], *(i[k] for k in WEIGHT_NAMES), i["kv_cache"],
                                        *(i[k] for k in TAIL_NAMES), plan, config=C)
    assert not torch.equal(out["kv_cache"][:, -1, -1], i["kv_cache"][:, -1, -1]), "ring row ring - 1 not written"
    plan["final_slot_mapping"] = torch.full_like(plan["final_slot_mapping"], -1)
    out = op(backend, "prefill_cp_swa")(i["x_hc"], *(i[k] for k in WEIGHT_NAMES), i["kv_cache"],
                                        *(i[k] for k in TAIL_NAMES), plan, config=C)
    assert torch.equal(out["kv_cache"], i["kv_cache"]), "a decode-window row whose slot is -1 must write nothing"


# --- seeded defects ------------------------------------------------------------------------------------------

def _rank_major_pred(*args, config, ops=None):
    """The tile-0 overlay read from the rank-major block before the owner's (2 * rank + part - 1), not the
    logical predecessor segment."""
    from kernels.v4.cp_swa import prefill_cp_swa

    plan = dict(args[-1])
    cp = plan["owner_segments"].shape[0]
    plan["predecessor_segments"] = (torch.arange(2 * cp, dtype=torch.int32) - 1).reshape(cp, 2)
    return prefill_cp_swa(*args[:-1], plan, config=config, ops=ops)


def _window_not_published(*args, config, ops=None):
    from kernels.v4.cp_swa import prefill_cp_swa

    out = dict(prefill_cp_swa(*args, config=config, ops=ops))
    out["kv_cache"] = args[13].clone()
    return out


def _newest_first(*args, **kwargs):
    from kernels.v4.cp_swa import cp_swa_plan

    plan = dict(cp_swa_plan(*args, **kwargs))
    plan["swa_indices"] = plan["swa_indices"].flip(-1).contiguous()
    return plan


def _tail_from_segment_start(*args, **kwargs):
    """The pred overlay taken from the predecessor's first rows instead of its last (same when len <= R)."""
    from kernels.v4.cp_swa import cp_swa_plan

    plan = dict(cp_swa_plan(*args, **kwargs))
    plan["overlay_position_ids"] = plan["overlay_position_ids"].clone()
    r = plan["overlay_position_ids"].shape[-1] // 2
    starts = plan["segment_starts"]
    for rank in range(plan["owner_segments"].shape[0]):
        for part in range(2):
            s = int(plan["owner_segments"][rank, part])
            if s > 0:
                row = plan["overlay_position_ids"][rank, part, 0, :r]
                shift = int(row[0]) - int(starts[s - 1]) if int(row[0]) >= 0 else 0
                row[row >= 0] -= shift
    return plan


SEEDED_DEFECTS = [
    SeededDefect("cp-swa:rank-major-predecessor", "prefill_cp_swa", _rank_major_pred,
                 "test_the_cp_sublayer_is_the_unsplit_prefills", "x_out"),
    SeededDefect("cp-swa:window-not-published", "prefill_cp_swa", _window_not_published,
                 "test_the_cp_sublayer_is_the_unsplit_prefills", "kv_cache"),
    SeededDefect("cp-swa-plan:newest-first", "cp_swa_plan", _newest_first,
                 "test_the_plan_lowers_every_window_key_to_its_row", "swa_indices"),
    SeededDefect("cp-swa-plan:tail-from-segment-start", "cp_swa_plan", _tail_from_segment_start,
                 "test_the_plan_lowers_every_window_key_to_its_row", "which names position"),
]
