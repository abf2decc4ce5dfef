"""Precision comparators: bounds are tight (just under passes, just over fails), one bad row cannot be
diluted, non-finite values fail, padding never counts toward the active budget. Spec: §6.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.checks.precision import check_output_budget, check_ratio_allclose
from contracts.tolerances import FP8_BUDGET, ROW_BOUND
from pto_pytest.defect import shared
from pto_pytest.plugin import op

FACTORS = st.sampled_from((0.97, 0.99, 1.01, 1.03))
SCALES = st.sampled_from((1e-3, 1.0, 37.5, 1e3))


def _rows(seed: int, rows: int, width: int, scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn((rows, width), generator=g, dtype=torch.float64) * scale).to(torch.float32)


def _alternating(width: int) -> torch.Tensor:
    return torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(width)], dtype=torch.float64)


def _rms(x: torch.Tensor) -> float:
    return float(x.double().pow(2).mean().sqrt())


@given(seed=st.integers(0, 2**31), rows=st.integers(1, 16), width=st.sampled_from((32, 64, 512)),
       scale=SCALES, factor=FACTORS, data=st.data())
@pytest.mark.operators("check_row_precision")
def test_row_precision_rms_bound_is_tight(backend, seed, rows, width, scale, factor, data):
    """RMS(a-e) = factor * (1e-6 + 0.01*RMS(e)) on one row: passes iff factor < 1."""
    check = op(backend, "check_row_precision")
    e = _rows(seed, rows, width, scale)
    a = e.clone()
    r = data.draw(st.integers(0, rows - 1), label='r')
    bound = ROW_BOUND.rms_atol + ROW_BOUND.rms_rtol * _rms(e[r])
    a[r] = (e[r].double() + factor * bound * _alternating(width)).float()
    result = check(a, e)
    assert result.ok == (factor < 1), f"factor {factor}: {result.message()}"
    if not result.ok:
        assert f"[{r}]" in result.message(), f"message does not name row {r}: {result.message()}"


@given(seed=st.integers(0, 2**31), rows=st.integers(1, 16), width=st.sampled_from((32, 64, 512)),
       scale=SCALES, factor=FACTORS, data=st.data())
@pytest.mark.operators("check_row_precision")
def test_row_precision_peak_bound_is_tight(backend, seed, rows, width, scale, factor, data):
    """One element off by factor * (1e-5 + 0.05*RMS(e)) (RMS error stays in bound): passes iff factor < 1."""
    check = op(backend, "check_row_precision")
    e = _rows(seed, rows, width, scale)
    a = e.clone()
    r, col = data.draw(st.integers(0, rows - 1), label='r'), data.draw(st.integers(0, width - 1), label='col')
    bound = ROW_BOUND.peak_atol + ROW_BOUND.peak_rtol * _rms(e[r])
    a[r, col] = float(e[r, col].double() + factor * bound)
    result = check(a, e)
    assert result.ok == (factor < 1), f"factor {factor}: {result.message()}"


@given(seed=st.integers(0, 2**31), good_rows=st.integers(1, 511), width=st.sampled_from((32, 128)),
       scale=SCALES, data=st.data())
@pytest.mark.operators("check_row_precision")
def test_row_precision_one_bad_row_is_not_diluted(backend, seed, good_rows, width, scale, data):
    """A single row at 1.5x its RMS bound fails however many perfect rows surround it."""
    check = op(backend, "check_row_precision")
    e = _rows(seed, good_rows + 1, width, scale)
    a = e.clone()
    r = data.draw(st.integers(0, good_rows), label='r')
    bound = ROW_BOUND.rms_atol + ROW_BOUND.rms_rtol * _rms(e[r])
    a[r] = (e[r].double() + 1.5 * bound * _alternating(width)).float()
    result = check(a, e)
    assert not result.ok, f"a row at 1.5x its bound among {good_rows} good rows passed"
    assert f"[{r}]" in result.message(), result.message()


@given(seed=st.integers(0, 2**31), rows=st.integers(1, 8), width=st.sampled_from((8, 64)),
       bad=st.sampled_from((math.nan, math.inf, -math.inf)), data=st.data())
@pytest.mark.operators("check_row_precision")
def test_row_precision_nonfinite_fails(backend, seed, rows, width, bad, data):
    """NaN or Inf anywhere fails: in the output, in the reference, or at the same element in both."""
    check = op(backend, "check_row_precision")
    r, col = data.draw(st.integers(0, rows - 1), label='r'), data.draw(st.integers(0, width - 1), label='col')
    for sides in (("actual",), ("expected",), ("actual", "expected")):
        e = _rows(seed, rows, width, 1.0)
        a = e.clone()
        for side in sides:
            (a if side == "actual" else e)[r, col] = bad
        result = check(a, e)
        assert not result.ok, f"{bad} at [{r}][{col}] of {' and '.join(sides)} passed: {result.message()}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.operators("check_row_precision")
def test_row_precision_low_precision_dtypes(backend, dtype):
    """BF16/FP16/FP32 compare without allclose: equal passes, a 10 % row error fails, shape/dtype/empty fail."""
    check = op(backend, "check_row_precision")
    e = _rows(7, 4, 64, 1.0).to(dtype)
    assert check(e, e.clone()).ok
    bad = e.clone()
    bad[2] = (bad[2].float() * 1.1).to(dtype)
    assert not check(bad, e).ok
    assert not check(e[:3], e).ok, "shape mismatch passed"
    assert not check(e.float(), e).ok or dtype == torch.float32, "dtype mismatch passed"
    assert not check(e[:0], e[:0]).ok, "numel 0 passed"


@given(seed=st.integers(0, 2**31), rows=st.integers(8, 32), factor=FACTORS, data=st.data())
@pytest.mark.operators("check_output_budget")
def test_output_budget_row_bound_is_tight(backend, seed, rows, factor, data):
    """One row at factor*2 % relative L2 among exact rows: passes iff factor < 1 (global stays < 1 %)."""
    check = op(backend, "check_output_budget")
    e = _rows(seed, rows, 64, 1.0)
    e = e / e.double().norm(dim=1, keepdim=True).float()  # unit rows so the global share is 1/rows
    a = e.clone()
    r = data.draw(st.integers(0, rows - 1), label='r')
    a[r] = (e[r].double() + factor * FP8_BUDGET.row_rel_l2 * _alternating(64) / 8.0).float()
    result = check(a, e)
    assert result.ok == (factor < 1), f"factor {factor}: {result.message()}"


@given(seed=st.integers(0, 2**31), rows=st.integers(1, 16), factor=FACTORS)
@pytest.mark.operators("check_output_budget")
def test_output_budget_global_bound_is_tight(backend, seed, rows, factor):
    """Every row at factor*1 % relative L2: passes iff factor < 1."""
    check = op(backend, "check_output_budget")
    e = _rows(seed, rows, 64, 1.0).double()
    a = (e + factor * FP8_BUDGET.global_rel_l2 * e.norm(dim=1, keepdim=True) * _alternating(64) / 8.0)
    result = check(a.float(), e.float())
    assert result.ok == (factor < 1), f"factor {factor}: {result.message()}"


@pytest.mark.operators("check_output_budget")
def test_output_budget_zero_reference_rows_must_be_exactly_zero(backend):
    check = op(backend, "check_output_budget")
    e = _rows(3, 6, 32, 1.0)
    e[4] = 0
    a = e.clone()
    assert check(a, e).ok
    a[4, 7] = 1e-30
    result = check(a, e)
    assert not result.ok and "[4]" in result.message(), result.message()


@given(seed=st.integers(0, 2**31), active=st.integers(1, 8), inactive=st.integers(8, 64),
       leaf=st.sampled_from(("fp8_budget", "ratio_allclose")))
@pytest.mark.operators("check_active_split")
def test_active_split_padding_cannot_dilute_active_error(backend, seed, active, inactive, leaf):
    """Active rows at 1.5 % global error fail even when many exact padding rows would dilute a pooled budget."""
    split = op(backend, "check_active_split")
    e = _rows(seed, active + inactive, 64, 1.0).double()
    a = e.clone()
    a[:active] = e[:active] * 1.015
    if leaf == "fp8_budget":
        leaf_fn = check_output_budget
    else:
        a[:active] = e[:active] + 0.5  # every active element fails; pooled they could fit a 0.5 % quota
        a[:active, 1:] = e[:active, 1:]  # only one element per active row fails

        def leaf_fn(x, y, **kw):
            return check_ratio_allclose(x, y, atol=1e-3, rtol=1e-3, max_error_ratio=0.01, **kw)
    result = split(a.float(), e.float(), active, leaf=leaf_fn)
    assert not result.ok, f"active error was diluted by {inactive} padding rows: {result.message()}"
    assert "active" in result.message(), result.message()


@given(seed=st.integers(0, 2**31), active=st.integers(0, 8), inactive=st.integers(1, 8), data=st.data())
@pytest.mark.operators("check_active_split")
def test_active_split_inactive_rows_compared_separately(backend, seed, active, inactive, data):
    """Sentinel padding rows equal to the reference pass; a changed padding row fails on its own."""
    split = op(backend, "check_active_split")
    e = _rows(seed, active + inactive, 32, 1.0)
    e[active:] = 13.0
    a = e.clone()
    assert split(a, e, active).ok
    r = data.draw(st.integers(active, active + inactive - 1), label='r')
    a[r] = 0.0
    result = split(a, e, active)
    assert not result.ok and "inactive" in result.message(), result.message()


@given(seed=st.integers(0, 2**31), active=st.integers(0, 12), tp=st.sampled_from((1, 2, 4, 8)), data=st.data())
@pytest.mark.operators("check_owner_rows")
def test_owner_rows_require_zero_padding(backend, seed, active, tp, data):
    """Each rank's owned rows compare; its padding rows must be exactly zero (a 13.0 sentinel fails)."""
    check = op(backend, "check_owner_rows")
    capacity = active + data.draw(st.integers(0, 4), label='spare capacity')
    width = -(-capacity // tp) if capacity else 0
    bounds = [(min(r * width, active), max(0, min(width, active - min(r * width, active))), width) for r in range(tp)]
    e = _rows(seed, active, 16, 1.0)
    slabs = []
    for first, count, w in bounds:
        slab = torch.zeros((w, 16))
        slab[:count] = e[first:first + count]
        slabs.append(slab)
    assert check(slabs, e, bounds).ok
    padded = [r for r, (_f, c, w) in enumerate(bounds) if c < w]
    if padded:
        rank = data.draw(st.sampled_from(padded), label='rank')
        first, count, w = bounds[rank]
        row = data.draw(st.integers(count, w - 1), label='row')
        slabs[rank][row] = 13.0
        result = check(slabs, e, bounds)
        assert not result.ok, f"rank{rank} padding row {row} = 13.0 passed: {result.message()}"
        assert f"rank{rank}" in result.message(), result.message()


@given(seed=st.integers(0, 2**31), replicas=st.integers(2, 8), dtype=st.sampled_from((torch.bfloat16, torch.float32)),
       data=st.data())
@pytest.mark.operators("check_replicas_identical")
def test_replicas_must_be_byte_identical(backend, seed, replicas, dtype, data):
    """Flipping the lowest mantissa bit of one element of one replica fails, naming replica and element."""
    check = op(backend, "check_replicas_identical")
    base = _rows(seed, 4, 8, 1.0).to(dtype)
    reps = [base.clone() for _ in range(replicas)]
    assert check(reps).ok
    k = data.draw(st.integers(1, replicas - 1), label='k')
    r, c = data.draw(st.integers(0, 3), label='r'), data.draw(st.integers(0, 7), label='c')
    itype = torch.int16 if dtype == torch.bfloat16 else torch.int32
    bits = reps[k].view(itype)
    bits[r, c] ^= 1
    result = check(reps)
    assert not result.ok, f"replica{k}[{r}][{c}] differs by one bit but passed: {result.message()}"
    assert f"replica{k}" in result.message() and f"[{r}][{c}]" in result.message(), result.message()


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("precision:AVERAGING_ROWS", "test_row_precision_one_bad_row_is_not_diluted", "good rows passed"),
    shared("precision:NAN_BLIND", "test_row_precision_nonfinite_fails", "passed"),
    shared("precision:RMS_ONLY", "test_row_precision_peak_bound_is_tight", "factor 1.0"),
    shared("precision:SPLIT_POOLED", "test_active_split_padding_cannot_dilute_active_error", "active"),
    shared("precision:SPLIT_POOLED", "test_active_split_inactive_rows_compared_separately", "inactive"),
    shared("precision:OWNER_ROWS_IGNORE_PADDING", "test_owner_rows_require_zero_padding", "rank"),
    shared("precision:REPLICAS_ALLCLOSE", "test_replicas_must_be_byte_identical", "replica"),
    shared("precision:RMS_BOUND_2PCT", "test_row_precision_rms_bound_is_tight", "factor 1.0"),
    shared("precision:DTYPE_BLIND", "test_row_precision_low_precision_dtypes", "dtype mismatch passed"),
    shared("precision:ROW_BUDGET_3PCT", "test_output_budget_row_bound_is_tight", "factor 1.0"),
    shared("precision:GLOBAL_BUDGET_2PCT", "test_output_budget_global_bound_is_tight", "factor 1.0"),
    shared("precision:ZERO_ROWS_TOLERANT", "test_output_budget_zero_reference_rows_must_be_exactly_zero", "assert"),
]
