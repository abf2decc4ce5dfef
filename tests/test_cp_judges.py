"""The CP prefill judges (contracts.compare.v4_cp_x_out, v4_cp_kv_cache) fail on each kind of wrong input they can
see: NaN on one side, a row without a query that is not 0, an order-only difference (two query rows swapped), one
output wrong among several, a ring row the reference did not write. Upstream's reldiff bound ignores absolute
differences under 3e-3, so a wrong row of lower magnitude is judged only by the contracts' bit-exact test on one
backend (contracts/test_cp_swa.py::test_the_split_changes_no_bit_on_one_backend): shown here too, as a limit."""

from __future__ import annotations

import torch

from contracts.compare import COMPARATORS, Context, compare_all


def _case():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2, 2, 4, 2, 8, generator=g) + 2.0
    req = torch.full((2, 2, 2, 4), -1, dtype=torch.int32)
    req[..., :3] = 0
    x[req < 0] = 0
    ring = torch.randn(2, 2, 4, 1, 8, generator=g).to(torch.bfloat16)
    kv = ring.clone()
    kv[:, 1, 2] = torch.randn(2, 1, 8, generator=g).to(torch.bfloat16)  # the rows the reference wrote
    inputs = {"query_token_to_request": req, "kv_cache": ring}
    return x, kv, inputs


def _ok(name, a, e, inputs):
    return COMPARATORS[name]("x_out" if name == "v4_cp_x_out" else "kv_cache", a, e,
                             Context(inputs=inputs, actual_outputs={}, expected_outputs={}, params={})).ok


def test_the_x_out_judge_fails_on_each_kind_of_wrong_input():
    x, _, i = _case()
    assert _ok("v4_cp_x_out", x.clone(), x, i)
    nan = x.clone()
    nan[0, 0, 0, 0, 0, 0] = float("nan")
    assert not _ok("v4_cp_x_out", nan, x, i), "NaN on the actual side"
    assert not _ok("v4_cp_x_out", x, nan, i), "NaN on the expected side"
    idle = x.clone()
    idle[1, 1, 1, 3, 0, 0] = 1e-30
    assert not _ok("v4_cp_x_out", idle, x, i), "a row without a query must be exactly 0"
    swapped = x.clone()
    swapped[0, 0, 0, [0, 1]] = x[0, 0, 0, [1, 0]]
    assert not _ok("v4_cp_x_out", swapped, x, i), "two query rows swapped"
    low = x.clone()
    low[0, 1, 0, 2] = 1e-4
    wrong_low = low.clone()
    wrong_low[0, 1, 0, 2] = -1e-4
    assert _ok("v4_cp_x_out", wrong_low, low, i), "limit: upstream's reldiff ignores |d| < 3e-3 (see the docstring)"


def test_the_ring_judge_fails_on_each_kind_of_wrong_input():
    _, kv, i = _case()
    assert _ok("v4_cp_kv_cache", kv.clone(), kv, i)
    nan = kv.clone()
    nan[0, 1, 2, 0, 0] = float("nan")
    assert not _ok("v4_cp_kv_cache", nan, kv, i), "NaN in a written row"
    stray = kv.clone()
    stray[1, 0, 0, 0, 0] += 1
    assert not _ok("v4_cp_kv_cache", stray, kv, i), "a row the reference did not write"
    swapped = kv.clone()
    swapped[:, 1, 2] = kv[:, 1, 2].flip(-1)
    assert not _ok("v4_cp_kv_cache", swapped, kv, i), "a written row's channels in another order"


def test_one_wrong_output_of_several_fails_the_tree():
    x, kv, i = _case()
    wrong = kv.clone()
    wrong[0, 1, 2] = 0
    ctx = Context(inputs=i, actual_outputs={"x_out": x, "kv_cache": wrong},
                  expected_outputs={"x_out": x, "kv_cache": kv}, params={})
    results = compare_all({"x_out": "v4_cp_x_out", "kv_cache": "v4_cp_kv_cache"}, ctx)
    assert results["x_out"].ok and not results["kv_cache"].ok
