"""Each comparator clause fails on its own (issue #26 item 2), on inputs every other clause passes, and where a
plausible other reading of the clause (per-row instead of global, global instead of per-row, totals instead of
the per-expert split) would give the opposite verdict, that reading is computed here and shown to disagree.

Each case: the comparator on the expected output itself passes; a change just inside the clause passes (so
every clause passes there); the same change just outside fails, naming the clause. Where a case names an
alternative reading, the alternative's verdict on the failing (or passing) input is computed and is the
opposite one, so a comparator implementing the alternative fails this module.
"""

from __future__ import annotations

import pytest
import torch

from contracts.checks.cache import check_mapped_values
from contracts.checks.moe import check_moe_rows, check_recv_y
from contracts.checks.precision import check_row_precision
from contracts.tolerances import MAX_ABS, RELDIFF_PCT, RELDIFF_THD, ROW_BOUND


def _global_rel_l2(a: torch.Tensor, e: torch.Tensor) -> float:
    return float((a - e).double().norm() / e.double().norm())


def _mean_row_rel_l2(a: torch.Tensor, e: torch.Tensor) -> float:
    return float(((a - e).double().norm(dim=1) / e.double().norm(dim=1)).mean())


def test_the_mapped_rows_bound_is_one_global_relative_l2_not_a_mean_of_rows():
    """Rows of unequal norms (100 and 1). A relative error of 0.5 on the small row is 0.005 globally: within
    0.01, passes (a mean of per-row errors, 0.25, would fail it). 0.015 on the large row is 0.015 globally:
    fails (the per-row mean, 0.0075, would pass it). Spec: §6 (relative L2 over the mapped rows)."""
    e = torch.zeros(2, 4)
    e[0, 0], e[1, 0] = 100.0, 1.0
    mapped = torch.tensor([True, True])
    small_off = e.clone()
    small_off[1, 0] += 0.5
    assert _global_rel_l2(small_off, e) <= 0.01 < _mean_row_rel_l2(small_off, e)
    r = check_mapped_values("kv", small_off, e, mapped, max_rel_l2=0.01)
    assert r.ok, r.message()
    large_off = e.clone()
    large_off[0, 0] += 1.5
    assert _mean_row_rel_l2(large_off, e) <= 0.01 < _global_rel_l2(large_off, e)
    r = check_mapped_values("kv", large_off, e, mapped, max_rel_l2=0.01)
    assert not r.ok and "relative L2 over mapped rows; worst row 0" in r.message(), r.message()
    assert check_mapped_values("kv", e, e, mapped, max_rel_l2=0.01).ok
    unmapped = large_off.clone()  # the same error on a row that is not mapped is not judged
    assert check_mapped_values("kv", unmapped, e, torch.tensor([False, True]), max_rel_l2=0.01).ok


def test_the_row_bound_is_per_row_not_global():
    """check_row_precision judges each row against its own RMS: a row 1000 times smaller than the other with
    an error of 10 % of its RMS fails, although the error is 1e-4 of the whole tensor's RMS (a global bound, or
    one relative to the largest row, would pass it). Spec: §6."""
    g = torch.Generator().manual_seed(0)
    e = torch.randn(2, 64, generator=g, dtype=torch.float64)
    e[1] *= 1e-3
    a = e.clone()
    a[1] += 0.1 * float(e[1].pow(2).mean().sqrt())
    assert _global_rel_l2(a, e) < 1e-3
    assert check_row_precision(e, e).ok
    r = check_row_precision(a, e)
    assert not r.ok and "[1]" in r.message(), r.message()
    inside = e.clone()
    inside[1] += 0.5 * ROW_BOUND.rms_rtol * float(e[1].pow(2).mean().sqrt())  # half the row's RMS budget
    assert check_row_precision(inside, e).ok


def _moe_case():
    e = torch.full((10, 50), 4.0, dtype=torch.float64)
    return e, e.clone()


@pytest.mark.parametrize("clause", ["worst |Δ|", "relative diff quota", "padding row", "non-finite"])
def test_each_moe_row_clause_fails_alone(clause):
    """check_moe_rows' four clauses, each just inside (passes) and just outside (fails, naming it). The worst
    |Δ| case moves one element (under the quota); the quota case moves many elements by less than the worst
    |Δ| bound; the padding case touches only a row past num_tokens; the non-finite one a single element."""
    e, a = _moe_case()
    tokens = 8
    flat = a[:tokens].reshape(-1)
    if clause == "worst |Δ|":
        flat[0] += MAX_ABS
        assert check_moe_rows(a, e, tokens).ok
        flat[0] += 1e-9
        needle = "worst |Δ|"
    elif clause == "relative diff quota":
        quota = int(RELDIFF_PCT * flat.numel())
        flat[:quota] *= 1 + RELDIFF_THD * 1.01  # each |Δ| 0.012, far under MAX_ABS
        assert check_moe_rows(a, e, tokens).ok
        flat[quota] *= 1 + RELDIFF_THD * 1.01
        needle = "over relative diff"
    elif clause == "padding row":
        a[tokens:] = e[tokens:]
        assert check_moe_rows(a, e, tokens).ok
        a[tokens + 1, 3] = torch.nextafter(e[tokens + 1, 3], torch.tensor(5.0, dtype=torch.float64))
        needle = "padding row"
    else:
        assert check_moe_rows(a, e, tokens).ok
        flat[7] = float("nan")
        needle = "output"
    r = check_moe_rows(a, e, tokens)
    assert not r.ok and needle in r.message(), r.message()


def test_recv_y_judges_each_experts_rows_not_their_total():
    """Two local experts with 2 rows each: the same rows, swapped between the experts, leave every count and
    the sum over experts unchanged (a comparator of totals would pass them) and fail, naming the expert; the
    counts moved between experts with the same total fail on the count. Spec: MO-05."""
    g = torch.Generator().manual_seed(3)
    want = torch.zeros(2, 3, 8, dtype=torch.float64)
    want[:, :2] = torch.randn(2, 2, 8, generator=g, dtype=torch.float64)
    counts = torch.tensor([2, 2])
    assert check_recv_y(want, want, counts, counts, recv_max=3).ok
    swapped = want.flip(0)
    assert torch.equal(swapped.sum(0), want.sum(0))  # the totals agree
    r = check_recv_y(swapped, want, counts, counts, recv_max=3)
    assert not r.ok and "expert0" in r.message(), r.message()
    moved = torch.tensor([3, 1])
    r = check_recv_y(want, want, moved, counts, recv_max=3)
    assert not r.ok and "recv_expert_count" in r.message(), r.message()


# --- the layout clause of every comparator, fed a wrong layout (tests/mutation/clauses.py drops each) ------------

def _layout_cases():
    from contracts.checks import cache, moe, topk
    from contracts.checks.attention import check_layer_output
    from contracts.checks.precision import check_row_precision as leaf

    f, i32 = torch.zeros(4, 3), torch.zeros(4, 3, dtype=torch.int32)
    return {
        "check_bytes_outside": lambda: cache.check_bytes_outside("kv", f.double(), f, torch.zeros(4, dtype=torch.bool)),
        "check_v4_index_scores": lambda: topk.check_v4_index_scores(f.double(), f),
        "check_v4_topk": lambda: topk.check_v4_topk(i32.long(), i32, f, f, torch.full((4,), 3), topk=3, offset=0),
        "check_candidate_blocks": lambda: topk.check_candidate_blocks(
            torch.zeros(4, 3, dtype=torch.int32), f, torch.full((4,), 3), block=1, topk_blocks=1),
        "check_gate_ids": lambda: moe.check_gate_ids(i32.long(), i32, f, n_experts=8),
        "check_gate_weights": lambda: moe.check_gate_weights(f.double(), i32, f, scale=1.0),
        "check_moe_rows": lambda: moe.check_moe_rows(f[:3], f, 2),
        "check_recv_y": lambda: moe.check_recv_y(torch.zeros(2, 3, 4)[:, :2], torch.zeros(2, 3, 4), torch.zeros(2),
                                                 torch.zeros(2), recv_max=3),
        "check_recv_y (counts)": lambda: moe.check_recv_y(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), torch.zeros(3),
                                                          torch.zeros(2), recv_max=3),
        "check_topk_overlap": lambda: topk.check_topk_overlap(i32.long(), i32),
        "check_ffn_owned": lambda: moe.check_ffn_owned(f, f, torch.zeros(4, dtype=torch.int64), 4),
        "check_layer_output": lambda: check_layer_output("SWA", torch.zeros(2, 4, 3).double(), torch.zeros(2, 4, 3),
                                                         wiring="replicated", tp=2, active=4, tokens=4, leaf=leaf),
    }


@pytest.mark.parametrize("check", sorted(_layout_cases()))
def test_each_comparator_refuses_a_wrong_layout_by_name(check):
    """An actual output of another dtype or shape than the expected one is a failure naming the layout, not an
    exception from the arithmetic that follows and not a pass (zeros compare equal to zeros in any dtype)."""
    r = _layout_cases()[check]()
    assert not r.ok and ("layout" in r.message() or "shape" in r.message()), r.message()


# --- the half-layer judge: its structural clauses, each alone ---------------------------------------------------

@pytest.fixture(scope="module")
def c2a():
    from contracts.half_layer_inputs import HalfLayerCase, build
    from kernels.config import LayerKind
    from kernels.reference.attention_layer import with_reference_scores

    case = HalfLayerCase(LayerKind.C2A_FULL, "prefill", "sharded", 2)
    inputs = build(case)
    expected, scores = with_reference_scores(inputs, kind=case.kind, phase=case.phase, wiring=case.wiring, tp=case.tp,
                                             config=case.config)
    return case, inputs, expected, scores


def _judge(c2a, actual, **kw):
    from contracts.checks.attention import judge_half_layer

    case, inputs, expected, scores = c2a
    return judge_half_layer(actual, expected, inputs, kind=case.kind, phase=case.phase, wiring=case.wiring,
                            tp=case.tp, block_size=case.config.block_size, **{"scores": scores, **kw})


@pytest.mark.parametrize("what", ["missing", "extra", "window_payload", "state_cache", "gathered", "topk_indices",
                                  "only"])
def test_each_structural_clause_of_the_half_layer_judge_fails_alone(c2a, what):
    """C2A FULL prefill, sharded: the reference's own outputs pass; then one thing wrong at a time -- an output
    missing, an unexpected one, a cache / state / gather / selection of another dtype, a name that is not an
    output of the mode, a differing selection with no reference scores to judge it -- fails naming it."""
    _, _, expected, _ = c2a
    assert _judge(c2a, dict(expected)).ok
    actual, kw, needle = dict(expected), {}, what
    if what == "missing":
        del actual["state_cache"]
        needle = "missing ['state_cache']"
    elif what == "extra":
        actual["candidate_mask"] = torch.zeros(1)
        needle = "unexpected ['candidate_mask']"
    elif what == "only":
        kw, needle = {"only": "no_such_output"}, "an output of this mode"
    else:
        actual[what] = actual[what].to(torch.float64 if actual[what].is_floating_point() else torch.int64)
        needle = f"{what}.layout" if what != "window_payload" else "window_payload.layout"
    r = _judge(c2a, actual, **kw)
    assert not r.ok and needle in r.message(), r.message()


def _replicated_prefill(kind):
    """(case, inputs, the reference outputs, a judge of an actual output dict) for a replicated TP2 prefill call."""
    from contracts.checks.attention import judge_half_layer
    from contracts.half_layer_inputs import HalfLayerCase, build
    from kernels.config import LayerKind
    from kernels.reference.attention_layer import attention_half_layer

    case = HalfLayerCase(LayerKind(kind), "prefill", "replicated", 2)
    inputs = build(case)
    call = dict(kind=case.kind, phase=case.phase, wiring=case.wiring, tp=case.tp)
    expected = attention_half_layer(inputs, config=case.config, **call)

    def judge(actual, **kw):
        return judge_half_layer(actual, expected, inputs, block_size=case.config.block_size, **call, **kw)

    return case, inputs, expected, judge


def test_a_mode_that_must_not_write_a_cache_is_judged_on_its_input_bytes():
    """C1A REINDEX reads the index cache it must not write: the judge compares it with the input's bytes; another
    dtype fails naming its layout and one flipped bit of it fails (the unchanged-cache clauses). A differing
    selection with no reference scores to judge it fails saying so."""
    case, inputs, expected, judge = _replicated_prefill("C1A_REINDEX")

    assert judge(dict(expected)).ok
    for bad in (expected["index_payload"].view(torch.int8), expected["index_payload"][:-1]):  # dtype, one block short
        r = judge(dict(expected, index_payload=bad))
        assert not r.ok and "index_payload.layout" in r.message(), r.message()
    written = dict(expected, index_payload=expected["index_payload"].clone())
    flat = written["index_payload"].view(torch.uint8).reshape(-1)
    flat[0] ^= 1
    r = judge(written)
    assert not r.ok and "index" in r.message(), r.message()
    sel = expected["topk_indices"].clone()
    sel[0] = sel[0].flip(0)
    r = judge(dict(expected, topk_indices=sel), scores=None)
    assert not r.ok and "no reference scores" in r.message(), r.message()


# --- single clauses of the Top-K and gate comparators ------------------------------------------------------------

def test_the_overlap_variant_counts_rows_before_the_overlap():
    """C2A overlap: 99 of the 100 expected rows, no extra one, overlap 0.99 >= 0.98 -- but a row short: the count
    clause fails it (the overlap alone would pass)."""
    from contracts.checks.topk import check_topk_overlap

    want = torch.arange(100, dtype=torch.int32)[None]
    got = want.clone()
    got[0, -1] = -1
    r = check_topk_overlap(got, want)
    assert not r.ok and "99 rows" in r.message(), r.message()


def test_a_displaced_v4_pick_whose_score_moved_past_its_hard_bound_fails_alone():
    """Expected picks [0, 1] on scores 4, 3, 2.999, 1; the kernel picks [0, 2] and reports position 2 at 3.999. On
    both score rows the swap is inside the bounds (no inversion, no clear boundary miss), but position 2's score
    moved by 1.0, past its hard bound max(4·(1e-4 + |s|/128), 5e-3): that clause alone fails."""
    from contracts.checks.topk import check_v4_topk

    e = torch.tensor([[4.0, 3.0, 2.999, 1.0]])
    a = e.clone()
    a[0, 2] = 3.999
    got, want = torch.tensor([[0, 2, -1, -1]], dtype=torch.int32), torch.tensor([[0, 1, -1, -1]], dtype=torch.int32)
    r = check_v4_topk(got, want, a, e, torch.tensor([4]), topk=2, offset=0)
    assert not r.ok and "hard bound" in r.message(), r.message()
    a[0, 2] = 2.999 + 0.01  # inside the bound: the tie swap passes
    assert check_v4_topk(got, want, a, e, torch.tensor([4]), topk=2, offset=0).ok


def test_the_gate_clauses_fail_alone():
    """Ids: a tie swap inside the score bounds passes the default rule and fails the strict one. Weights: a NaN
    weight fails as non-finite (the row sum and the split compare NaN as False and would pass it); weights with
    the right row sum split 0.5 / 0.5 where the scores give 0.6 / 0.4 fail the split clause alone."""
    from contracts.checks.moe import check_gate_ids, check_gate_weights

    scores = torch.tensor([[0.6, 0.4, 0.4, 0.1]])
    want, swapped = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([[0, 2]], dtype=torch.int32)
    assert check_gate_ids(swapped, want, scores, n_experts=4).ok
    r = check_gate_ids(swapped, want, scores, n_experts=4, rule="strict")
    assert not r.ok and "strict" in r.message(), r.message()
    exact = torch.tensor([[0.6, 0.4]]) * 2.5
    assert check_gate_weights(exact, want, scores, scale=2.5).ok
    nan = exact.clone()
    nan[0, 1] = float("nan")
    r = check_gate_weights(nan, want, scores, scale=2.5)
    assert not r.ok and "finite and > 0" in r.message(), r.message()
    even = torch.tensor([[1.25, 1.25]])
    r = check_gate_weights(even, want, scores, scale=2.5)
    assert not r.ok and "weights[0][0]" in r.message(), r.message()


def test_a_reused_selection_is_judged_byte_for_byte_and_by_layout():
    """C1A REUSE takes its Top-K as given: the judge holds it byte for byte -- an INT64 copy fails on its layout,
    one changed row fails naming topk_indices."""
    case, inputs, expected, judge = _replicated_prefill("C1A_REUSE")

    assert judge(dict(expected)).ok
    r = judge(dict(expected, topk_indices=expected["topk_indices"].long()))
    assert not r.ok and "topk_indices.layout" in r.message(), r.message()
    sel = expected["topk_indices"].clone()
    sel[0, 0] += 1
    r = judge(dict(expected, topk_indices=sel))
    assert not r.ok and "topk_indices" in r.message(), r.message()


def test_gate_codes_judges_the_real_rows_tiles_and_nothing_past_them():
    """``gate_codes`` (x_norm_i8 at dspark's 128 rows): 6 real rows make one 16-row M-tile. A code off by one
    inside it (a real row, a padding row of the tile, a row of zero codes), or two of its rows exchanged, fails; rows
    past the tile left 0 (the kernel never codes them) pass; another dtype or shape fails naming the layout."""
    from contracts.compare import Context, compare_all

    expected = torch.randint(-127, 128, (128, 8), dtype=torch.int8, generator=torch.Generator().manual_seed(3))
    expected[5] = 0  # a real row of zero codes (the low-magnitude case below)
    inputs = {"num_tokens": torch.tensor(6)}

    def judge(actual):
        return compare_all({"x_norm_i8": "gate_codes"}, Context(inputs, {"x_norm_i8": actual},
                                                                 {"x_norm_i8": expected}, {}, "replicated"))["x_norm_i8"]

    past = expected.clone()
    past[16:] = 0
    assert judge(past).ok, judge(past).message()
    for row in (2, 15):  # a real row, a padding row inside the tile
        wrong = past.clone()
        wrong[row, 0] = wrong[row, 0] + (1 if wrong[row, 0] < 127 else -1)
        r = judge(wrong)
        assert not r.ok and f"[{row}]" in r.message(), r.message()
    swapped = past.clone()  # an order-only difference: two rows of the tile exchanged
    swapped[[3, 4]] = past[[4, 3]]
    small = past.clone()  # a low-magnitude row off by one code
    small[5] = 0
    small[5, 7] = 1
    for wrong, row in ((swapped, 3), (small, 5)):
        r = judge(wrong)
        assert not r.ok and f"[{row}]" in r.message(), r.message()
    for bad in (past.to(torch.int32), past[:, :-1]):
        r = judge(bad)
        assert not r.ok and ("layout" in r.message() or "shape" in r.message()), r.message()


def _layout_first_comparators():
    """The library comparators whose first step is the layout check (``bad = _layout(name, a, e)``)."""
    import inspect

    from contracts import compare

    return [name for name, fn in sorted(compare.COMPARATORS.items())
            if inspect.getsource(fn).split('"""')[-1].strip().startswith("bad = _layout(name, a, e)")]


@pytest.mark.parametrize("comparator", _layout_first_comparators())
@pytest.mark.parametrize("wrong", ["dtype", "shape"])
def test_each_layout_checking_comparator_fails_a_wrong_layout_by_name(comparator, wrong):
    """Fed an actual output of another dtype or shape than the expected one, each comparator that starts with the
    layout check returns a failure naming the layout -- not an exception from the arithmetic after it. (Found
    2026-12-03: ``if bad:`` on a failed CheckResult is false, so the check was passed over and a wrong layout
    raised inside the comparison.)"""
    from contracts.compare import Context, compare_all

    expected = torch.zeros(4, 8)
    actual = expected.double() if wrong == "dtype" else expected[:, :-1].clone()
    ctx = Context({}, {"out": actual}, {"out": expected}, {}, "replicated")
    r = compare_all({"out": comparator}, ctx)["out"]
    assert not r.ok and "layout" in r.message(), f"{comparator} on a wrong {wrong}: {r.message()}"


def test_the_layout_first_list_is_not_empty():
    """The parametrization above found the comparators it is meant for (exact among them)."""
    names = _layout_first_comparators()
    assert "exact" in names and len(names) >= 10, names
