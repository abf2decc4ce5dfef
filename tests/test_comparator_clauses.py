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
from contracts.checks.moe import MAX_ABS, RELDIFF_PCT, RELDIFF_THD, check_moe_rows, check_recv_y
from contracts.checks.precision import ROW_BOUND, check_row_precision


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
