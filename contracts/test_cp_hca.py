"""V4-Flash's context-parallel HCA prefill: the plan's compressed picks, tails and state snapshots (``cp_hca_plan``)
and the sublayer computed rank by rank with HCA's ratio-128 compressor inside (``prefill_cp_hca``). Judged against
the unsplit prefill: the ranks' outputs must be the unsplit HCA stage's rows, every rank's compressed cache the
unsplit compressor's rows at that rank's own slots, every rank's state the unsplit state of the chunk's last window
-- including windows that start on one rank and close on another. Golden case and bad calls: the records in
``kernels/v4/cp_hca.py``. Spec: §7.1, §8."""

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
from kernels.v4.compressor import V4CompressorWeights
from kernels.v4.cp_hca import COMPRESSOR_NAMES, PLAN_NAMES, chunk_inputs
from kernels.v4.cp_swa import PLAN_NAMES as SWA_PLAN_NAMES
from kernels.v4.cp_swa import TAIL_NAMES, WEIGHT_NAMES
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

C = V4_FLASH_TINY
R = C.sliding_window
PAGE = C.c128_state_block_size


def _row(table: torch.Tensor, k: int, page: int) -> int:
    """Written from the rule: logical row k of a paged pool sits at page table[k // page], row k % page."""
    return int(table[k // page]) * page + k % page


@pytest.mark.operators("cp_hca_plan", "cp_swa_plan")
@given(cp=st.sampled_from([2, 4]), span=st.integers(R, 2 * R), fill=st.floats(0.0, 1.0),
       prefix=st.integers(0, 2500), seed=st.integers(0, 2**16))
@example(cp=2, span=R, fill=1.0, prefix=0, seed=0)  # every segment full, windows on segment bounds
@example(cp=2, span=R, fill=0.5, prefix=2100, seed=0)  # past index_topk x 128 positions: the cap binds
def test_the_hca_plan_picks_each_querys_closed_windows(backend, cp, span, fill, prefix, seed):
    """Any chunk: CP SWA's tables unchanged; a query at q picks compressed positions 0 .. min(index_topk,
    (q + 1) // 128) - 1 in order, then -1, and an empty row none; each segment's tail is its last min(R, len)
    positions; each (rank, part)'s snapshot the last min(R, end) positions up to its segment's end; the final
    segment the last holding a token."""
    n = max(1, round(fill * 2 * cp * span))
    table = torch.randperm(2, generator=torch.Generator().manual_seed(seed)).to(torch.int32)
    plan = op(backend, "cp_hca_plan")(n, cp, span, table, prefix=prefix, config=C)
    swa = op(backend, "cp_swa_plan")(n, cp, span, table, prefix=prefix, config=C)
    for name in SWA_PLAN_NAMES:
        assert torch.equal(plan[name], swa[name]), f"{name} differs from cp_swa_plan's (the SWA part is CP SWA's)"
    for name in PLAN_NAMES:
        assert plan[name].dtype == torch.int32, f"{name}: {plan[name].dtype}, expected int32 (the table the kernel reads)"
    topk = C.index_topk
    picks, qpos, req = plan["cmp_indices"], plan["query_position_ids"], plan["query_token_to_request"]
    assert tuple(picks.shape) == (cp, 2, 2, R, topk), f"cmp_indices {list(picks.shape)}"
    for where in torch.cartesian_prod(*(torch.arange(k) for k in picks.shape[:4])).tolist():
        row = picks[tuple(where)].tolist()
        seen = min(topk, (int(qpos[tuple(where)]) + 1) // 128) if int(req[tuple(where)]) >= 0 else 0
        assert row == list(range(seen)) + [-1] * (topk - seen), \
            f"cmp_indices{tuple(where)} = {row[:seen + 2]}..: query {int(qpos[tuple(where)])} " + \
            (f"picks compressed positions 0 .. {seen - 1}" if int(req[tuple(where)]) >= 0 else "is an empty row")
    shapes = {"segment_tail_positions": (2 * cp, R), "snapshot_positions": (cp, 2, R), "snapshot_valid": (cp, 2),
              "final_segment": (1,)}
    for name, shape in shapes.items():
        assert tuple(plan[name].shape) == shape, f"{name} {list(plan[name].shape)}, expected {list(shape)}"
    lens = [min(max(n - s * span, 0), span) for s in range(2 * cp)]
    starts = [prefix + s * span for s in range(2 * cp)]
    for s in range(2 * cp):
        k = min(R, lens[s])
        want = list(range(starts[s] + lens[s] - k, starts[s] + lens[s])) + [-1] * (R - k)
        assert plan["segment_tail_positions"][s].tolist() == want, \
            f"segment_tail_positions[{s}]: expected the last {k} positions of segment {s} (starts {starts[s]})"
    for rank in range(cp):
        for part in range(2):
            s = rank if part == 0 else 2 * cp - 1 - rank
            end = starts[s] + lens[s]
            k = min(R, end)
            assert int(plan["snapshot_valid"][rank, part]) == k and \
                plan["snapshot_positions"][rank, part].tolist() == list(range(end - k, end)) + [-1] * (R - k), \
                f"snapshot of rank {rank} part {part} (segment {s}, ending at {end}): expected its last {k} positions"
    assert plan["final_segment"].tolist() == [max(s for s in range(2 * cp) if lens[s])], \
        f"final_segment {plan['final_segment'].tolist()}: segments hold {lens}"


@pytest.mark.operators("cp_hca_plan")
def test_a_query_picks_by_the_rule_not_an_alternative(backend):
    """Hand vector: CP 2, span R, 2R + 10 tokens after 2043 cached. Segment 0 (rank 0) holds 2043 .. 2170: its row
    4 is position 2047, which closes window 15: it picks 16 positions (0 .. 15, the one it closes among them);
    row 5 (2048) also 16 (index_topk caps window 16's 17 closed positions at 16). Separated from pos // 128
    (window 15 missing at 2047), no cap (17 at 2048: the table is 16 wide, so a 17th would be dropped: the row
    is compared by its count), and picks from the newest window down (15, 14, ..)."""
    plan = op(backend, "cp_hca_plan")(2 * R + 10, 2, R, torch.arange(1, dtype=torch.int32), prefix=2043, config=C)
    assert plan["query_position_ids"][0, 0, 0, [4, 5]].tolist() == [2047, 2048], "segment 0 starts at the prefix"
    got = plan["cmp_indices"][0, 0, 0, [4, 5]].to(torch.int64)
    counts = (got >= 0).sum(1)
    want_counts = separates("min(index_topk, (q + 1) // 128) picks", torch.tensor([16, 16]),
                            q_over_128=torch.tensor([15, 16]), no_cap=torch.tensor([16, 17]))
    assert torch.equal(counts, want_counts), f"rows 2047, 2048 pick {counts.tolist()} positions, expected " \
                                             f"{want_counts.tolist()}"
    want = separates("oldest first", torch.arange(16).repeat(2, 1), newest_first=torch.arange(15, -1, -1).repeat(2, 1))
    assert torch.equal(got, want), f"rows 2047, 2048 pick {got[0, :4].tolist()}.., expected 0, 1, 2, .."


LAYOUTS = {"windows on segment bounds": (2, R, 4 * R, 0),
           "a window straddling two ranks": (2, R, 2 * R + 10, 5),
           "two tiles, short last, prefix's state": (2, 2 * R, 300, 70),
           "cp 4, every window straddles": (4, R + 72, 5 * R + 9, 130),
           "segments opening on a closing row": (2, R, 3 * R, 127)}


def _unsplit(backend, i, n, prefix):
    """The whole chunk as one request through the prefill HCA stage over rank 0's compressor pools and tables: a
    window cache of the prefix's positions (read from the ring) and the chunk's, identity pages; every closing
    position publishing at its slot through rank 0's cmp_block_table; every chunk row's state persisted (so the
    named unpersisted rules agree), of which the expectation reads the chunk's last R positions."""
    cache, pos, pages = cp_unsplit_window(i, n, prefix, C)
    cpage = i["cmp_kv"].shape[2]
    cmp_slots = torch.tensor([_row(i["cmp_block_table"][0], (p + 1) // 128 - 1, cpage) if (p + 1) % 128 == 0
                              else -1 for p in pos.tolist()], dtype=torch.int64)
    state_slots = torch.tensor([_row(i["state_block_table"][0], p, PAGE) if p >= prefix else -1
                                for p in pos.tolist()], dtype=torch.int64)
    attention = {**{k: i[k] for k in WEIGHT_NAMES}, **{k: i[k] for k in TAIL_NAMES}, "kv_cache": cache,
                 "swa_slot_mapping": pos.long(), "position_ids": pos, "block_table": torch.arange(pages, dtype=torch.int32),
                 "cmp_kv": i["cmp_kv"][0], "cmp_block_table": i["cmp_block_table"][0][None]}
    compressor = {"state_block_table": i["state_block_table"][0], "state_pool": i["state_pool"][0],
                  "weights": V4CompressorWeights(i["cmp_wkv"], i["cmp_wgate"], i["cmp_ape"], i["cmp_norm_w"]),
                  "cmp_slot_mapping": cmp_slots, "state_slot_mapping": state_slots}
    return op(backend, "v4_prefill_hca_stage")(i["x_all"][prefix:], attention, compressor, n, config=C)


def _cp(backend, i, **kwargs):
    return op(backend, "prefill_cp_hca")(i["x_hc"], *(i[k] for k in WEIGHT_NAMES), i["kv_cache"],
                                         *(i[k] for k in TAIL_NAMES), {k: i[k] for k in COMPRESSOR_NAMES},
                                         {k: i[k] for k in PLAN_NAMES}, config=C, **kwargs)


def _expected(i, whole, n, prefix):
    """Every rank's outputs as the unsplit prefill gives them: x_out at each query row's position, the ring's decode
    window, each closed window's compressed row at that rank's slot, the state of the last R positions at that
    rank's rows -- every other byte the rank's input."""
    cp, hd, total = i["x_hc"].shape[0], C.head_dim, prefix + n
    real = i["query_token_to_request"] >= 0
    x = torch.zeros_like(i["x_hc"])
    x[real] = whole["x_out"][(i["query_position_ids"][real] - prefix).long()]
    kv, cmp, state = i["kv_cache"].clone(), i["cmp_kv"].clone(), i["state_pool"].clone()
    ring = i["kv_cache"].shape[1] * C.block_size
    cpage, tl = cmp.shape[2], i["block_table"].tolist()
    for p in range(max(prefix, total - R), total):
        kv.reshape(cp, -1, hd)[:, tl[(p % ring) // C.block_size] * C.block_size + p % C.block_size] = \
            whole["kv_cache"].reshape(-1, hd)[p]
    for r in range(cp):
        for k in range(prefix // 128, total // 128):  # every window closing at 128k + 127 >= prefix
            cmp[r].reshape(-1, hd)[_row(i["cmp_block_table"][r], k, cpage)] = \
                whole["cmp_kv"].reshape(-1, hd)[_row(i["cmp_block_table"][0], k, cpage)]
        for p in range(max(prefix, total - R), total):
            state[r].reshape(-1, 2 * hd)[_row(i["state_block_table"][r], p, PAGE)] = \
                whole["state_pool"].reshape(-1, 2 * hd)[_row(i["state_block_table"][0], p, PAGE)]
    return {"x_out": x, "kv_cache": kv, "cmp_kv": cmp, "state_pool": state}


JUDGES = {"x_out": "v4_cp_x_out", "kv_cache": "v4_cp_kv_cache", "cmp_kv": "v4_cmp_pool", "state_pool": "v4_state_pool"}


@pytest.mark.operators("prefill_cp_hca", "v4_prefill_hca_stage")
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_cp_hca_sublayer_is_the_unsplit_prefills(backend, layout):
    """Every query row of every rank equals the unsplit prefill HCA stage's row of its position; every rank's ring
    holds the unsplit cache's last R positions, its compressed cache each window the chunk closed at that rank's
    own slot (the tables differ per rank), its state pool the unsplit state of the chunk's last R positions -- and
    nothing else new. Judged by the comparators the record names; the empty rows exactly 0 though their streams are
    not."""
    cp, span, n, prefix = LAYOUTS[layout]
    i = chunk_inputs(C, 7, cp=cp, span=span, num_tokens=n, prefix=prefix, noisy_padding=True)
    got, whole = _cp(backend, i), _unsplit(backend, i, n, prefix)
    want = _expected(i, whole, n, prefix)
    assert (prefix + n) // 128 > prefix // 128, f"{layout}: no window closes in the chunk"
    ctx = Context(inputs=i, actual_outputs=got, expected_outputs=want, params={})
    for name, judge in JUDGES.items():
        verdict = COMPARATORS[judge](name, got[name], want[name], ctx)
        assert verdict.ok, f"{layout}: {name} is not the unsplit prefill's ({judge}): {verdict}"


@pytest.mark.whole_backend("the CP split against the same backend's unsplit stage, bit for bit")
@pytest.mark.operators("prefill_cp_hca", "v4_prefill_hca_stage")
def test_the_hca_split_changes_no_bit_on_one_backend(backend):
    """On one backend the split is data movement only: the query rows' x_out, the compressed rows (window 1 starts
    on rank 0 and closes on rank 1) and the final state are the unsplit stage's bytes."""
    cp, span, n, prefix = LAYOUTS["a window straddling two ranks"]
    i = chunk_inputs(C, 11, cp=cp, span=span, num_tokens=n, prefix=prefix)
    got, want = _cp(backend, i), _expected(i, _unsplit(backend, i, n, prefix), n, prefix)
    for name in JUDGES:
        same = got[name].view(torch.int16 if got[name].dtype == torch.bfloat16 else torch.int32) == \
            want[name].view(torch.int16 if want[name].dtype == torch.bfloat16 else torch.int32)
        assert bool(same.all()), f"{name}: {int((~same).sum())} elements differ from the unsplit stage's bytes, " \
                                 f"first at {tuple((~same).nonzero()[0].tolist())}"


def _bad(i, case):
    i = dict(i)
    comp = {k: i[k] for k in COMPRESSOR_NAMES}
    plan = {k: i[k] for k in PLAN_NAMES}
    if case == "state pool BF16":
        comp["state_pool"] = comp["state_pool"].to(torch.bfloat16)
    elif case == "state pool width":
        comp["state_pool"] = comp["state_pool"][..., :C.head_dim].contiguous()
    elif case == "cmp cache FP32":
        comp["cmp_kv"] = comp["cmp_kv"].float()
    elif case == "cmp table float":
        comp["cmp_block_table"] = comp["cmp_block_table"].float()
    elif case == "compressor missing":
        del comp["cmp_ape"]
    elif case == "plan missing":
        del plan["snapshot_positions"]
    elif case == "final segment":
        plan["final_segment"] = torch.tensor([4], dtype=torch.int32)
    elif case == "cmp page unmapped":
        comp["cmp_block_table"] = comp["cmp_block_table"].clone()
        comp["cmp_block_table"][1, 0] = -1
    elif case == "state page unmapped":
        comp["state_block_table"] = comp["state_block_table"].clone()
        comp["state_block_table"][0, 20] = -1
    elif case == "plan table float":
        plan["snapshot_valid"] = plan["snapshot_valid"].float()
    elif case == "final segment -1":
        plan["final_segment"] = torch.tensor([-1], dtype=torch.int32)
    elif case == "first window's page unmapped on rank 1":
        comp["state_block_table"] = comp["state_block_table"].clone()
        comp["state_block_table"][1, 0] = -1
    elif case == "last chunk page unmapped on rank 1":
        comp["state_block_table"] = comp["state_block_table"].clone()
        comp["state_block_table"][1, (5 + 2 * R + 10 - 1) // PAGE] = -1
    elif case == "one state pool for all ranks":
        comp["state_pool"] = comp["state_pool"][:1]
    elif case == "state table a page short":
        comp["state_block_table"] = comp["state_block_table"][:, :(5 + 2 * R + 10 - 1) // PAGE]
    return i, comp, plan


@pytest.mark.operators("prefill_cp_hca")
@pytest.mark.parametrize("case, field", [
    ("state pool BF16", "state_pool"), ("state pool width", "state_pool"), ("cmp cache FP32", "cmp_kv"),
    ("cmp table float", "cmp_block_table"), ("compressor missing", "compressor"), ("plan missing", "plan"),
    ("final segment", "plan.final_segment[0]"), ("cmp page unmapped", "cmp_block_table[1, 0]"),
    ("state page unmapped", "state_block_table[0, 20]"), ("plan table float", "plan.snapshot_valid"),
    ("final segment -1", "plan.final_segment[0]"),
    ("first window's page unmapped on rank 1", "state_block_table[1, 0]"),
    ("last chunk page unmapped on rank 1", f"state_block_table[1, {(5 + 2 * R + 10 - 1) // PAGE}]"),
    ("state table a page short", f"state_block_table[0, {(5 + 2 * R + 10 - 1) // PAGE}]"),
    ("one state pool for all ranks", "state_pool"),
    ("the chunk's last row opens a page on rank 1", "state_block_table[1, 34]"),
    ("the first window's page unmapped on rank 1 after 200 cached", "state_block_table[1, 16]")])
def test_a_malformed_cp_hca_call_is_refused_naming_its_field(backend, case, field):
    """Each malformed piece refused naming it: the pools' dtypes and shapes, a table that is not an integer table,
    a missing piece, a final segment outside the world (4, -1), a compressed slot (window 1, page 0 of rank 1's
    table) or a state row the chunk's windows touch through an unmapped page or past the table (position 160 on
    rank 0; on rank 1 the first window's page 0, which reaches back into the prefix, and the chunk's last page) --
    every rank's tables map every window the chunk touches: each rank holds the state after it."""
    if case == "the chunk's last row opens a page on rank 1":  # position 272 alone on page 34
        i = chunk_inputs(C, 3, cp=2, span=R, num_tokens=2 * R + 12, prefix=5)
        i["state_block_table"] = i["state_block_table"].clone()
        i["state_block_table"][1, 34] = -1
    elif case == "the first window's page unmapped on rank 1 after 200 cached":  # window 1 opens at 128: page 16
        i = chunk_inputs(C, 3, cp=2, span=R, num_tokens=2 * R + 10, prefix=200)
        i["state_block_table"] = i["state_block_table"].clone()
        i["state_block_table"][1, 16] = -1
    else:
        i = chunk_inputs(C, 3, cp=2, span=R, num_tokens=2 * R + 10, prefix=5)
    bad, comp, plan = _bad(i, case)
    with pytest.raises(ContractInputError) as exc:
        op(backend, "prefill_cp_hca")(bad["x_hc"], *(bad[k] for k in WEIGHT_NAMES), bad["kv_cache"],
                                      *(bad[k] for k in TAIL_NAMES), comp, plan, config=C)
    named = exc.value.field + (f"[{', '.join(map(str, exc.value.index))}]" if exc.value.index else "")
    assert named == field, f"{case}: refused naming {named!r}, not {field!r}: {exc.value}"


@pytest.mark.operators("prefill_cp_hca", "cp_hca_plan")
def test_a_chunk_inside_segment_zero_is_accepted(backend):
    """The refusals' bounds are the edges themselves: a chunk of 10 tokens (default prefix 0) lies in segment 0,
    the final segment 0, and runs; its state snapshot is positions 0 .. 9 on every rank."""
    i = chunk_inputs(C, 5, cp=2, span=R, num_tokens=10, prefix=0)
    plan = op(backend, "cp_hca_plan")(10, 2, R, i["block_table"], config=C)
    assert plan["final_segment"].tolist() == [0] and int(plan["segment_starts"][0]) == 0, \
        f"final segment {plan['final_segment'].tolist()}, first start {int(plan['segment_starts'][0])}"
    out = _cp(backend, i)
    rows = {_row(i["state_block_table"][r], p, PAGE) for r in range(1) for p in range(10)}
    moved = (out["state_pool"][0] != i["state_pool"][0]).reshape(-1, 2 * C.head_dim).any(1).nonzero().flatten()
    assert set(moved.tolist()) == rows, f"rank 0's state rows moved: {sorted(moved.tolist())[:12]}"


# --- seeded defects ------------------------------------------------------------------------------------------

def _no_predecessor_tail(*args, config, ops=None):
    """Each segment compressed over its own rows only: a window that starts in the predecessor pools zeros there."""
    from kernels.v4 import cp_hca

    plan = dict(args[-1])
    plan["segment_tail_positions"] = torch.full_like(plan["segment_tail_positions"], -1)
    return cp_hca.prefill_cp_hca(*args[:-1], plan, config=config, ops=ops)


def _owner_only(*args, config, ops=None):
    """Each compressed row written into its owner's cache only (no all-gather of the compressed rows)."""
    from kernels.v4 import cp_hca

    out = dict(cp_hca.prefill_cp_hca(*args, config=config, ops=ops))
    comp, plan = args[-2], args[-1]
    cmp = out["cmp_kv"].clone()
    owner = int(plan["owner_segments"].flatten()[0])  # rank 0 keeps its rows, the others their input's
    for r in range(cmp.shape[0]):
        if r != owner:
            cmp[r] = comp["cmp_kv"][r]
    out["cmp_kv"] = cmp
    return out


def _first_segment_state(*args, config, ops=None):
    """The state snapshot of segment 0 handed to every rank, not the final segment's."""
    from kernels.v4 import cp_hca

    plan = dict(args[-1])
    plan["final_segment"] = torch.zeros_like(plan["final_segment"])
    return cp_hca.prefill_cp_hca(*args[:-1], plan, config=config, ops=ops)


def _picks_one_short(*args, **kwargs):
    from kernels.v4 import cp_hca

    plan = dict(cp_hca.cp_hca_plan(*args, **kwargs))
    q = plan["query_position_ids"].long()
    seen = torch.clamp(q // 128, max=plan["cmp_indices"].shape[-1])
    cols = torch.arange(plan["cmp_indices"].shape[-1])
    plan["cmp_indices"] = torch.where((plan["query_token_to_request"] >= 0)[..., None] & (cols < seen[..., None]),
                                      cols, -1).to(torch.int32)
    return plan


SEEDED_DEFECTS = [
    SeededDefect("cp-hca:no-predecessor-tail", "prefill_cp_hca", _no_predecessor_tail,
                 "test_the_cp_hca_sublayer_is_the_unsplit_prefills", "cmp_kv"),
    SeededDefect("cp-hca:owner-only-cache", "prefill_cp_hca", _owner_only,
                 "test_the_cp_hca_sublayer_is_the_unsplit_prefills", "cmp_kv"),
    SeededDefect("cp-hca:first-segment-state", "prefill_cp_hca", _first_segment_state,
                 "test_the_cp_hca_sublayer_is_the_unsplit_prefills", "state_pool"),
    SeededDefect("cp-hca-plan:picks-one-short", "cp_hca_plan", _picks_one_short,
                 "test_the_hca_plan_picks_each_querys_closed_windows", "cmp_indices"),
]
