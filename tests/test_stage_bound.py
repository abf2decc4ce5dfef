"""The stage bound's row judge (``contracts.checks.precision.rows_outside_stage_bound``) used by the V4 stage and
layer contracts: it passes what is within the bound and fails each kind of wrong input, naming the row."""

from __future__ import annotations

import pytest
import torch

from contracts.checks.precision import rows_outside_stage_bound


def _rows(g):
    return torch.randn(4, 2, 8, generator=g) * 3


def test_within_the_bound_passes_and_just_past_it_fails():
    g = torch.Generator().manual_seed(0)
    want = _rows(g)
    close = want * (1 + 2**-9)  # half the relative bound (1/128) away
    assert not bool(rows_outside_stage_bound(close, want).any())
    far = want.clone()
    far[2, 1, 3] = want[2, 1, 3] * (1 + 2**-6) + 1e-3  # twice the relative bound plus atol
    assert rows_outside_stage_bound(far, want).tolist() == [False, False, True, False]


@pytest.mark.parametrize("kind", ["low-magnitude row", "NaN actual", "NaN expected", "inf actual",
                                  "right sum, wrong split", "one wrong output of several", "order-only difference"])
def test_each_kind_of_wrong_input_is_outside(kind):
    g = torch.Generator().manual_seed(1)
    want = _rows(g)
    got = want.clone()
    if kind == "low-magnitude row":
        want[1] = want[1] * 1e-6
        got = want.clone()
        got[1, 0, 0] += 5e-4  # past atol (1e-4) on a row whose values are ~1e-6
        bad = [1]
    elif kind == "NaN actual":
        got[3, 1, 7] = float("nan")
        bad = [3]
    elif kind == "NaN expected":
        want[0, 0, 0] = float("nan")
        bad = [0]
    elif kind == "inf actual":
        got[2, 0, 1] = float("inf")
        bad = [2]
    elif kind == "right sum, wrong split":
        got[0, 0, 0] += 1.0
        got[0, 0, 1] -= 1.0  # the row's sum is unchanged
        bad = [0]
    elif kind == "one wrong output of several":
        got[2, 1, 5] = -got[2, 1, 5] + 1.0
        bad = [2]
    else:  # two rows swapped: the same values, another order
        got = want[[1, 0, 2, 3]]
        bad = [0, 1]
    assert rows_outside_stage_bound(got, want).nonzero().flatten().tolist() == bad, kind


def test_terms_widen_the_bound_only_where_the_summands_are_large():
    """A cancelled element (x_out near 0, its summands large) is judged relative to the summands' magnitude."""
    want = torch.tensor([[1e-3, 2.0]])
    got = want + torch.tensor([[2e-2, 1e-2]])  # element 1 within 1e-4 + 2/128 on its own
    assert rows_outside_stage_bound(got, want).tolist() == [True]  # 2e-2 past 1e-4 + 1e-3/128
    terms = torch.tensor([[4.0, 0.0]])  # element 0 is the sum of terms of magnitude 4
    assert rows_outside_stage_bound(got, want, terms).tolist() == [False]  # 2e-2 <= 1e-4 + 4.001/128
    assert rows_outside_stage_bound(want + torch.tensor([[0.1, 0.0]]), want, terms).tolist() == [True]
