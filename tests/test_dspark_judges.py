"""The drafter's x_out judge (``dspark_x_out``: upstream dspark_attention.py's ratio_allclose(1e-2, 1e-2) with a
5 % quota) shown failing on each kind of wrong input: NaN on either side, two rows swapped, a whole row wrong, a row
with its sum right and its split wrong, the quota passed by one element; and passing the expected output, an element
just inside its bound, and the quota's last element. Its limit is pinned too: a row below atol is not judged."""

from __future__ import annotations

import math

import torch

from contracts.compare import COMPARATORS, Context
from contracts.tolerances import DSPARK_X_OUT_QUOTA, DSPARK_X_OUT_TOL

ATOL, RTOL = DSPARK_X_OUT_TOL


def _judge(a: torch.Tensor, e: torch.Tensor):
    return COMPARATORS["dspark_x_out"]("x_out", a, e, Context(inputs={}, actual_outputs={"x_out": a},
                                                               expected_outputs={"x_out": e}, params={}))


def _expected() -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return (torch.randn(10, 40, generator=g) + 2.0).to(torch.bfloat16)  # 400 elements, none near 0


def _outside(e: torch.Tensor, n: int) -> torch.Tensor:
    """``e`` with its first ``n`` elements moved to twice their bound."""
    a = e.float().clone().reshape(-1)
    a[:n] += 2 * (ATOL + RTOL * a[:n].abs())
    return a.reshape(e.shape).to(torch.bfloat16)


def test_the_expected_output_and_an_element_inside_its_bound_pass():
    e = _expected()
    assert _judge(e, e).ok
    a = e.float().clone()
    a[0, 0] += 0.5 * (ATOL + RTOL * abs(float(a[0, 0])))
    assert _judge(a.to(torch.bfloat16), e).ok


def test_the_quota_admits_its_last_element_and_fails_one_more():
    e = _expected()
    last = math.floor(DSPARK_X_OUT_QUOTA * e.numel())
    assert _judge(_outside(e, last), e).ok, f"{last} elements past the bound are the 5 % quota's"
    verdict = _judge(_outside(e, last + 1), e)
    assert not verdict.ok and verdict.n_failed == last + 1, verdict


def test_nan_on_either_side_fails():
    e = _expected()
    a = e.clone()
    a[3, 7] = float("nan")
    assert not _judge(a, e).ok, "a NaN in the actual output passed"
    assert not _judge(e, a).ok, "a NaN in the expected output passed"


def test_two_rows_swapped_and_one_row_wrong_fail():
    e = _expected()
    assert not _judge(e[[1, 0, *range(2, 10)]], e).ok, "two rows swapped passed"
    a = e.clone()
    a[4] = -a[4]
    assert not _judge(a, e).ok, "one row negated passed"


def test_a_wrong_layout_fails_by_name():
    e = _expected()
    verdict = _judge(e[:, :-1], e)
    assert not verdict.ok and "x_out" in verdict.message(), verdict


def test_a_right_row_sum_with_a_wrong_split_fails():
    """A row whose elements are reversed (its sum and norm unchanged, an order-only difference) fails; two elements
    traded alone (0.5 % of the elements) stay inside the 5 % quota, upstream's own allowance, pinned here."""
    e = _expected()
    a = e.clone()
    a[2] = e[2].flip(0)
    assert float(a.float().sum()) == float(e.float().sum())
    verdict = _judge(a, e)
    assert not verdict.ok and verdict.n_failed > DSPARK_X_OUT_QUOTA * e.numel(), verdict
    b = e.clone()
    b[2, 3], b[2, 30] = e[2, 30], e[2, 3]
    assert _judge(b, e).ok, "two traded elements are past the quota: the pinned allowance moved"


def test_a_low_magnitude_row_is_judged_only_down_to_atol():
    """A limit of upstream's bound, pinned: a row whose values are all below atol (1e-2) may be replaced by zeros
    and pass; the same row at 10x atol fails. Low-magnitude outputs are not judged by this comparator."""
    e = _expected().float()
    e[7] = e[7].sign() * 2e-3
    a = e.clone()
    a[7] = 0.0
    assert _judge(a.to(torch.bfloat16), e.to(torch.bfloat16)).ok, "the pinned limit moved: update the docs"
    e[7] = e[7].sign() * 0.1
    a = e.clone()
    a[7] = 0.0
    verdict = _judge(a.to(torch.bfloat16), e.to(torch.bfloat16))
    assert not verdict.ok and verdict.n_failed == 40, verdict
