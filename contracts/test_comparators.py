"""Comparators tested as the subjects they are: each clause of each bound passes just inside it and fails
just outside it (factor 1 -/+ 1e-6 of the bound, arithmetic in FP64), and each non-numeric clause
(non-finite values, zero reference rows, bytes vs values, padding, replicas equal in value but not in
bytes, per row vs mean of rows) is shown on a passing and a failing case.

The comparators a backend exposes (``check_*`` operators) are taken from the backend; the rest of the
check library (quantized cache, ring state, Top-K cutoff and overlap, ratio_allclose, the replay
comparators) is the harness's own and is called directly. Spec: §6, §5.3, §4.1, §7.1.
"""

from __future__ import annotations

import math

import pytest
import torch

from contracts import compare
from contracts.checks import cache as cache_checks
from contracts.checks.precision import check_ratio_allclose, check_row_precision
from contracts.checks.topk import TopKContext, check_topk_overlap, check_topk_validity
from contracts.separation import separates
from contracts.tolerances import OutputBudget
from pto_pytest.plugin import op, operator_params

EPS = 1e-6
D = 1024  # row width: a single-element error has RMS = peak / 32
F64 = torch.float64


def _alt(n: int) -> torch.Tensor:
    return torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(n)], dtype=F64)


def _ones(rows: int, width: int = D) -> torch.Tensor:
    return torch.ones((rows, width), dtype=F64)


# ---------------------------------------------------------------------------
# bound clauses: builder(factor) -> (operator, args, kwargs); factor 1 is exactly on the bound


def row_rms_rtol(f):  # RMS(e) = 1, uniform error |d| everywhere: RMS(a-e) = d, peak = d << 0.05
    e = _alt(D).reshape(1, D)
    return "check_row_precision", (e + f * (1e-6 + 0.01) * _alt(D).flip(0), e), {}


def row_rms_atol(f):  # zero reference: RMS bound is the absolute 1e-6
    e = torch.zeros((1, D), dtype=F64)
    return "check_row_precision", (e + f * 1e-6 * _alt(D), e), {}


def row_peak_rtol(f):  # one element off by the peak bound; its RMS is peak/32, well inside
    e = _alt(D).reshape(1, D)
    a = e.clone()
    a[0, 7] += f * (1e-5 + 0.05)
    return "check_row_precision", (a, e), {}


def row_peak_rtol_negative(f):  # the peak clause reads |a-e|: an error below the reference counts too
    e = _alt(D).reshape(1, D)
    a = e.clone()
    a[0, 8] -= f * (1e-5 + 0.05)
    return "check_row_precision", (a, e), {}


def row_peak_atol(f):
    e = torch.zeros((1, D), dtype=F64)
    a = e.clone()
    a[0, 3] = f * 1e-5
    return "check_row_precision", (a, e), {}


def row_one_row_of_many(f):  # 31 exact rows and one on the RMS bound: judged per row, not on the mean
    e = _alt(D).repeat(32, 1)
    a = e.clone()
    a[17] += f * (1e-6 + 0.01) * _alt(D).flip(0)
    return "check_row_precision", (a, e), {}


def budget_row(f):  # one row at the 2 % row bound, 15 exact rows: global 0.5 %, cosine 0.999987
    e = _ones(16)
    a = e.clone()
    a[5] += f * 0.02 * _alt(D)
    return "check_output_budget", (a, e), {}


def budget_global(f):  # every row at 1 %: rows inside 2 %, cosine 0.99995
    e = _ones(16)
    return "check_output_budget", (e + f * 0.01 * _alt(D), e), {}


def budget_cosine(f):  # the cosine clause alone (row and global clauses opened): error orthogonal to e
    e = _ones(4)
    r = math.sqrt(1 / 0.9999**2 - 1)  # |d|/|e| at which cos = 0.9999
    budget = OutputBudget(global_rel_l2=1.0, row_rel_l2=1.0, min_cosine=0.9999)
    return "check_output_budget", (e + (r * f) * _alt(D), e), {"budget": budget}


def budget_global_small(f):  # the same at 1e-3 scale: a reference whose whole norm is below 1
    name, (a, e), kw = budget_global(f)
    return name, (a * 1e-3, e * 1e-3), kw


def budget_tiny_row(f):  # a row whose reference norm is 1e-305 is judged against that norm, not a floor
    e = _ones(8)
    e[3] = 0.0
    e[3, 0] = 1e-305
    a = e.clone()
    a[3, 1] = f * 0.02 * 1e-305
    return "check_output_budget", (a, e), {}


def budget_global_negative(f):  # an all-negative reference: norms are magnitudes
    name, (a, e), kw = budget_global(f)
    return name, (-a, -e), kw


def budget_row_negative(f):
    name, (a, e), kw = budget_row(f)
    return name, (-a, -e), kw


def budget_global_tiny(f):  # squares of 1e-160 are subnormal: the norms must not lose them
    name, (a, e), kw = budget_global(f)
    return name, (a * 1e-160, e * 1e-160), kw


def budget_global_tiny_with_zero(f):  # a zero element must not make the norm fall back to squaring 1e-160s
    e = _ones(16) * 1e-160
    e[0, 0] = 0.0
    n = e.numel()
    return "check_output_budget", (e + f * 0.01 * math.sqrt((n - 1) / n) * 1e-160 * _alt(D), e), {}


def budget_global_tiny_negative(f):
    name, (a, e), kw = budget_global_tiny(f)
    return name, (-a, -e), kw


def budget_tiny_row_negative(f):
    name, (a, e), kw = budget_tiny_row(f)
    return name, (-a, -e), kw


def split_active(f):  # the active rows on the bound, many exact padding rows must not dilute them
    e = _alt(D).repeat(40, 1)
    a = e.clone()
    a[:2] += f * (1e-6 + 0.01) * _alt(D).flip(0)
    return "check_active_split", (a, e, 2), {}


def split_inactive(f):  # the inactive suffix is judged on its own
    e = _alt(D).repeat(6, 1)
    a = e.clone()
    a[5] += f * (1e-6 + 0.01) * _alt(D).flip(0)
    return "check_active_split", (a, e, 4), {}


def owner_rank(f):  # rank 1's owned row on the bound
    e = _alt(D).repeat(5, 1)
    slabs = [e[0:2].clone(), e[2:4].clone(), torch.cat([e[4:5], torch.zeros((1, D), dtype=F64)])]
    slabs[1][1] += f * (1e-6 + 0.01) * _alt(D).flip(0)
    return "check_owner_rows", (slabs, e, [(0, 2, 2), (2, 2, 2), (4, 1, 2)]), {}


BOUNDS = {fn.__name__: fn for fn in (row_rms_rtol, row_rms_atol, row_peak_rtol, row_peak_rtol_negative, row_peak_atol,
                                     row_one_row_of_many,
                                     budget_row, budget_global, budget_global_small, budget_tiny_row, budget_cosine,
                                     budget_global_negative, budget_row_negative, budget_global_tiny,
                                     budget_global_tiny_with_zero, budget_global_tiny_negative,
                                     budget_tiny_row_negative,
                                     split_active, split_inactive,
                                     owner_rank)}


@pytest.mark.parametrize("clause", operator_params(BOUNDS, lambda build: build(1.0)[0]))
def test_comparator_bound_is_exact(backend, clause):
    """Inside the clause by 1e-6 of its bound passes; outside by 1e-6 fails. Spec: §6."""
    for factor, want in ((1 - EPS, True), (1 + EPS, False)):
        name, args, kwargs = BOUNDS[clause](factor)
        result = op(backend, name)(*args, **kwargs)
        assert result.ok is want, (f"{clause}: {name} at {factor} x its bound {'failed' if want else 'passed'}: "
                                   f"{result.message()}")


def _bf16_rms_case(k: int):
    """BF16 row: alternating +-1 plus errors of 2^-6 on k elements and 2^-7 on the rest (all exact in BF16):
    RMS(a-e) = 2^-7 sqrt(1 + 3k/1024); k = 218 is 0.0100008 (inside 0.010001), k = 219 is 0.0100098."""
    e = _alt(D).to(torch.bfloat16).reshape(1, D)
    d = torch.full((D,), 2.0**-7, dtype=F64)
    d[:k] = 2.0**-6
    return (e.double() + d).to(torch.bfloat16), e


@pytest.mark.operators("check_row_precision")
def test_row_bound_is_judged_in_fp64_for_bf16_outputs(backend):
    """BF16 outputs are judged in FP64: 2e-5 (relative) inside the RMS bound passes, 9e-4 outside fails.
    Spec: §6 (prefill C1A `_compare_attention_rows`, FP64)."""
    check = op(backend, "check_row_precision")
    inside, outside = _bf16_rms_case(218), _bf16_rms_case(219)
    assert check(*inside).ok, check(*inside).message()
    assert not check(*outside).ok, "a BF16 row 9e-4 past the RMS bound passed"


@pytest.mark.operators("check_output_budget", "check_row_precision")
def test_bounds_are_inclusive(backend):
    """An error exactly on a bound passes (the rules are <=): the peak atol, the 2 % row budget, the 1 %
    global budget and the 0.9999 cosine, each built so the FP64 quotient equals the bound's double."""
    rows = op(backend, "check_row_precision")
    e = torch.zeros((1, D), dtype=F64)
    a = e.clone()
    a[0, 3] = 1e-5  # |a-e| = 1e-5 = peak_atol + 0.05 * RMS(0); RMS = 1e-5/32 inside 1e-6
    assert rows(a, e).ok, rows(a, e).message()
    budget = op(backend, "check_output_budget")
    e = torch.zeros((16, 2), dtype=F64)
    e[:, 0] = 1.0
    a = e.clone()
    a[5, 1] = 0.02  # row 5: |a-e| / |e| = 0.02 exactly; global 0.005
    assert budget(a, e).ok, budget(a, e).message()
    a = e.clone()
    a[:, 1] = 0.01  # every row and the whole tensor at exactly 0.01 relative L2
    assert budget(a, e).ok, budget(a, e).message()
    e = torch.zeros((1, 1), dtype=F64)  # one element per row: RMS(d) = sqrt(d^2) = |d| exactly
    assert rows(e + 1e-6, e).ok, rows(e + 1e-6, e).message()  # RMS error exactly the 1e-6 atol
    x = 0.9999
    a = torch.tensor([[x, math.sqrt(1 - x * x)]], dtype=F64)  # |a| = 1: cosine within an ulp above 0.9999
    e = torch.tensor([[1.0, 0.0]], dtype=F64)
    opened = OutputBudget(global_rel_l2=1.0, row_rel_l2=1.0, min_cosine=0.9999)
    assert budget(a, e, budget=opened).ok, budget(a, e, budget=opened).message()


# ---------------------------------------------------------------------------
# non-numeric clauses: builder() -> (operator, args, kwargs, expected verdict)


def _nan_at(t, value, row=0, col=3):
    t = t.clone()
    t[row, col] = value
    return t


def _cases():
    e = _alt(64).repeat(3, 1)
    out = {}
    for op_name in ("check_row_precision", "check_output_budget"):
        for where in ("actual", "expected", "both"):
            for v in (math.nan, math.inf, -math.inf):
                a = _nan_at(e, v) if where in ("actual", "both") else e
                x = _nan_at(e, v) if where in ("expected", "both") else e
                out[f"{op_name}: {v} in {where}"] = (op_name, (a, x), {}, False)
        out[f"{op_name}: identical passes"] = (op_name, (e.clone(), e), {}, True)
        out[f"{op_name}: dtype differs"] = (op_name, (e.float(), e), {}, False)
        out[f"{op_name}: shape differs"] = (op_name, (e[:2], e), {}, False)
        out[f"{op_name}: empty"] = (op_name, (e[:0], e[:0]), {}, False)
    z = e.clone()
    z[1] = 0.0
    out["check_output_budget: zero reference row, output 1e-300"] = (
        "check_output_budget", (_nan_at(z, 1e-300, row=1), z), {}, False)
    out["check_output_budget: zero reference row, output -0.0"] = (
        "check_output_budget", (_nan_at(z, -0.0, row=1), z), {}, True)
    out["check_output_budget: all-zero reference, exact zeros"] = (
        "check_output_budget", (torch.zeros_like(e), torch.zeros_like(e)), {}, True)
    # owner rows: padding must be exactly zero (a subnormal fails, -0.0 passes, NaN fails)
    slabs = [e[0:2].clone(), torch.cat([e[2:3], torch.zeros((1, 64), dtype=F64)])]
    bounds = [(0, 2, 2), (2, 1, 2)]
    for label, v, want in (("5e-324", 5e-324, False), ("-0.0", -0.0, True), ("nan", math.nan, False)):
        s = [slabs[0], slabs[1].clone()]
        s[1][1, 9] = v
        out[f"check_owner_rows: padding {label}"] = ("check_owner_rows", (s, e, bounds), {}, want)
    s = [slabs[0], slabs[1].clone()]
    s[1][1, 9] = 1.0
    out["check_owner_rows: padding not required"] = ("check_owner_rows", (s, e, bounds),
                                                     {"require_zero_padding": False}, True)
    out["check_owner_rows: a rank short of its width"] = ("check_owner_rows", ([slabs[0], slabs[1][:1]], e, bounds),
                                                          {}, False)
    out["check_owner_rows: one rank missing"] = ("check_owner_rows", ([slabs[0]], e, bounds), {}, False)
    # replicas: bytes, not values
    r = e.float()
    neg = r.clone()
    neg[0, 0] = -0.0
    pos = r.clone()
    pos[0, 0] = 0.0
    out["check_replicas_identical: -0.0 vs 0.0"] = ("check_replicas_identical", ([pos, neg],), {}, False)
    nan1 = _nan_at(r, math.nan)
    nan2 = nan1.clone()
    nan2.view(torch.int32)[0, 3] ^= 1  # another NaN payload
    out["check_replicas_identical: two NaN payloads"] = ("check_replicas_identical", ([nan1, nan2],), {}, False)
    out["check_replicas_identical: same NaN bytes"] = ("check_replicas_identical", ([nan1, nan1.clone()],), {}, True)
    out["check_replicas_identical: one ulp"] = (
        "check_replicas_identical", ([r, torch.nextafter(r, torch.full_like(r, 9.0))],), {}, False)
    out["check_replicas_identical: dtype"] = ("check_replicas_identical", ([r, r.double()],), {}, False)
    out["check_active_split: num_tokens past the rows"] = ("check_active_split", (e, e.clone(), 4), {}, False)
    out["check_active_split: no active rows, exact"] = ("check_active_split", (e, e.clone(), 0), {}, True)
    out["check_active_split: one active row off"] = ("check_active_split", (_nan_at(e, 5.0), e, 1), {}, False)
    out["check_active_split: 1-D rows, exact"] = ("check_active_split", (e[0], e[0].clone(), 2), {}, True)
    out["check_active_split: output one row short"] = ("check_active_split", (e[:2], e, 2), {}, False)
    tiny = e * 1e-160  # norms multiply to 1e-318 (subnormal): an exact copy must still pass
    opened = OutputBudget(global_rel_l2=1.0, row_rel_l2=1.0, min_cosine=0.9999)
    out["check_output_budget: zero output, cosine clause alone"] = (
        "check_output_budget", (torch.zeros_like(e), e), {"budget": opened}, False)
    out["check_output_budget: tiny identical outputs"] = ("check_output_budget", (tiny.clone(), tiny), {}, True)
    wide = _alt(64).repeat(6, 1).reshape(2, 3, 64)
    quiet = wide.clone()
    quiet[0, 1, 5] = 0.0
    loud = quiet.clone()
    loud[0, 1, 5] = 1e-4  # inside its row's bound (RMS 1.25e-5, peak 1e-4), far outside an element's own
    out["check_row_precision: 3-D judged per row of the last dim"] = ("check_row_precision", (loud, quiet), {}, True)
    s0 = torch.tensor(2.5, dtype=F64)
    for op_name in ("check_row_precision", "check_output_budget"):
        out[f"{op_name}: 0-d identical passes"] = (op_name, (s0, s0.clone()), {}, True)
        out[f"{op_name}: 0-d off fails"] = (op_name, (s0 + 1, s0), {}, False)
        out[f"{op_name}: 3-D one row off"] = (op_name, (_nan_at(e, 5.0, row=2).reshape(3, 1, 64), e.reshape(3, 1, 64)),
                                             {}, False)
    out["check_active_split: all rows active, exact"] = ("check_active_split", (e, e.clone(), 3), {}, True)
    return out


CASES = _cases()


@pytest.mark.parametrize("case", operator_params(CASES, lambda row: row[0]))
def test_comparator_clause(backend, case):
    """Non-finite values fail wherever they are; layouts must match; a zero reference row needs an exactly
    zero output (-0.0 is zero); padding must be exactly zero; replicas must be byte-identical (-0.0 vs
    0.0 and two NaN payloads differ). Spec: §6, §7.1."""
    name, args, kwargs, want = CASES[case]
    result = op(backend, name)(*args, **kwargs)
    assert result.ok is want, f"{case}: expected {'pass' if want else 'fail'}, got {result.message()}"


# ---------------------------------------------------------------------------
# the check library's own comparators (no backend operator): each clause inside / outside


def test_ratio_allclose_elementwise_bound_and_quota():
    """|a-e| <= atol + rtol|e| per element, at most max_error_ratio of elements out; NaN always fails."""
    e = torch.ones(1000, dtype=F64)
    for f, want in ((1 - EPS, True), (1 + EPS, False)):
        a = e + f * (1e-2 + 1e-2 * 1.0)
        assert check_ratio_allclose(a, e, atol=1e-2, rtol=1e-2, max_error_ratio=0.0).ok is want
    a = e.clone()
    a[:5] += 1.0  # 5 of 1000 out: at a 0.5 % quota it passes, one more fails
    assert check_ratio_allclose(a, e, atol=1e-2, rtol=1e-2).ok
    a[5] += 1.0
    assert not check_ratio_allclose(a, e, atol=1e-2, rtol=1e-2).ok
    assert not check_ratio_allclose(_nan_at(e.reshape(1, -1), math.nan), e.reshape(1, -1), atol=1.0, rtol=1.0).ok


def test_ratio_allclose_counts_active_elements_and_needs_a_zero_tail():
    """Upstream's prefill SWA+mHC vectors (atol = rtol = 1e-2, 1 % of ACTIVE elements): 10 rows x 100 active
    with 10 bad elements pass, 11 fail; 5 rows x 100 with 5 bad pass, 6 fail -- although padding rows would
    dilute the quota if counted; NaN fails; a padding row 1e-5 off fails with zero_tail and names the row.
    Spec: AP-13, CH-20."""
    from contracts.checks.precision import comparator

    judge = comparator("prefill_swa_mhc")
    for rows, quota in ((10, 10), (5, 5)):
        e = torch.ones(rows + 6, 100, dtype=F64)
        e[rows:] = 0
        a = e.clone()
        a.view(-1)[:quota] += 1.0
        assert judge(a, e, valid_rows=rows).ok, (rows, quota)
        a.view(-1)[quota] += 1.0
        result = judge(a, e, valid_rows=rows)
        assert not result.ok and result.n_checked == rows * 100, (rows, result)
        assert check_ratio_allclose(a, e, atol=1e-2, rtol=1e-2, max_error_ratio=0.01).ok, \
            "counting the padding rows would have let it pass: the inputs separate the two quotas"
    e = torch.ones(4, 8, dtype=F64)
    e[3] = 0
    dirty = e.clone()
    dirty[3, 5] = 1e-5
    result = judge(dirty, e, valid_rows=3)
    assert not result.ok and result.worst.index == (3, 5) and "padding row" in result.worst.field
    assert check_ratio_allclose(dirty, e, atol=1e-2, rtol=1e-2, valid_rows=3).ok, "without zero_tail"
    assert not judge(_nan_at(e, math.nan), e, valid_rows=3).ok
    assert not check_ratio_allclose(e, e, atol=0, rtol=0, valid_rows=5).ok


def test_the_bf16_stage_budget_fails_one_row_just_over_2_to_the_minus_8():
    """A row whose relative L2 error is 2^-8 (1 + 1e-6) fails among good rows while every element stays inside
    ratio_allclose(1e-4, 1/128); the same row at 2^-8 (1 - 1e-6) passes; the failure names the row. Spec:
    AP-14."""
    from contracts.checks.precision import check_bf16_stage, check_row_budget

    e = torch.ones(3, 256, dtype=F64)
    for f, want in ((1 - 1e-6, True), (1 + 1e-6, False)):
        a = e.clone()
        a[1] += f * 2.0**-8
        assert check_ratio_allclose(a, e, atol=1e-4, rtol=1 / 128).ok, "elementwise rule alone passes"
        result = check_bf16_stage(a, e)
        assert result.ok is want, (f, result)
        if not want:
            assert result.worst.index == (1,) and result.spec == "AP-14"
    assert not check_row_budget(_nan_at(e, math.nan), e).ok
    zero = torch.zeros(2, 4, dtype=F64)
    assert check_row_budget(zero, zero).ok and not check_row_budget(zero + 1e-30, zero).ok


def test_the_ced_metrics_fail_just_outside_each_clause():
    """Global relative L2 0.02 and worst-row relative L2 0.05, each just inside passes and just outside fails
    (a single row at 0.05 keeps the global error under 0.02 when the output has many rows); non-finite fails.
    Spec: AP-15."""
    from contracts.checks.precision import check_ced_metrics

    e = torch.ones(100, 64, dtype=F64)
    for f, want in ((1 - 1e-6, True), (1 + 1e-6, False)):
        uniform = e + f * 0.02
        assert check_ced_metrics(uniform, e).ok is want, ("global", f)
        one_row = e.clone()
        one_row[7] += f * 0.05
        result = check_ced_metrics(one_row, e)
        assert result.ok is want, ("row", f)
        if not want:
            assert result.worst.index == (7,) and result.check == "check_ced_metrics"
    assert not check_ced_metrics(_nan_at(e, math.inf), e).ok


def test_the_decode_common_pre_mix_variant_stays_selectable():
    """The mHC coefficient rule is ratio_allclose(2.5e-5, 5e-3); decode_common's attention_pre_mix compare uses
    (1e-4, 1e-4). An error of 5e-5 on a coefficient of 1e-3 fails the first and passes the second; an error of
    2e-4 on a coefficient of 0.5 passes the first and fails the second. Spec: HC-07."""
    from contracts.tolerances import HC_MIX_TOL_VARIANTS

    current, common = HC_MIX_TOL_VARIANTS["hc_mixes"], HC_MIX_TOL_VARIANTS["decode_common_attention_pre_mix"]
    e = torch.tensor([[1e-3, 0.5]], dtype=F64)
    small = e + torch.tensor([[5e-5, 0.0]], dtype=F64)
    big = e + torch.tensor([[0.0, 2e-4]], dtype=F64)
    rule = lambda a, tol: check_ratio_allclose(a, e, atol=tol[0], rtol=tol[1], max_error_ratio=0.0).ok  # noqa: E731
    assert (rule(small, current), rule(small, common)) == (False, True)
    assert (rule(big, current), rule(big, common)) == (True, False)


def test_the_mxfp8_activation_is_judged_by_value_not_bytes():
    """A payload doubled under a scale one code smaller is the same value and passes (a byte comparison would
    fail); a value 2e-3 + 2e-3·|e| (1 + 1e-3) away fails and names the element and both scale codes; code 255
    fails; a wrong layout fails. Spec: CQ-25."""
    from contracts.checks.precision import check_mxfp8_activation

    values = torch.tensor([[0.5, -1.25, 3.0, 0.0] * 8])
    payload, scale = values.to(torch.float8_e4m3fn), torch.full((1, 1), 127, dtype=torch.uint8)
    twin = (values * 2).to(torch.float8_e4m3fn)
    assert check_mxfp8_activation(twin, scale - 1, payload, scale).ok
    assert not torch.equal(twin.view(torch.uint8), payload.view(torch.uint8))
    off = (values + torch.tensor([[0.0, 0.0, 0.25, 0.0] * 8])).to(torch.float8_e4m3fn)  # 3.0 -> 3.25
    result = check_mxfp8_activation(off, scale, payload, scale)
    assert not result.ok and result.worst.index == (0, 2) and "scale codes 127 vs 127" in result.worst.note
    assert not check_mxfp8_activation(payload, torch.full((1, 1), 255, dtype=torch.uint8), payload, scale).ok
    assert not check_mxfp8_activation(payload, scale.to(torch.int32), payload, scale).ok
    # the bound on the payload grid: under scale 2^-16 the expected 256 (0.0039) allows 2e-3 + 7.8e-6; 384 is
    # 1.95e-3 away and passes, 416 (the next payload) 2.44e-3 away and fails
    fine = torch.full((1, 1), 111, dtype=torch.uint8)
    grid = lambda v: torch.tensor([[v] + [0.0] * 31]).to(torch.float8_e4m3fn)  # noqa: E731
    assert check_mxfp8_activation(grid(384.0), fine, grid(256.0), fine).ok
    assert not check_mxfp8_activation(grid(416.0), fine, grid(256.0), fine).ok


@pytest.mark.parametrize("fmt, budget", [("mxfp8", 0.01), ("mxfp4", 0.04)])
def test_quantized_cache_value_budget_and_bytes(fmt, budget):
    """Mapped rows decoded within the format's relative L2 (MXFP8 1 %, MXFP4 4 %); unmapped payload and
    scale bytes exact; mapped values finite. Spec: §6 (quantized_cache_compare), CQ-07."""
    rows = 8
    payload = torch.randint(0, 256, (rows, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    scale = torch.randint(0, 256, (rows, 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    mapped = torch.zeros(rows, dtype=torch.bool)
    mapped[[1, 4]] = True
    ev = torch.ones((rows, 32), dtype=F64)
    for f, want in ((1 - EPS, True), (1 + EPS, False)):
        av = ev + f * budget * _alt(32)
        r = cache_checks.check_quantized_cache("c", (payload, scale), (payload.clone(), scale.clone()), mapped,
                                               actual_values=av, expected_values=ev, fmt=fmt)
        assert r.ok is want, f"{fmt} at {f} x {budget}: {r.message()}"
    for label, tensor_index in (("payload", 0), ("scale", 1)):
        bad = [payload.clone(), scale.clone()]
        bad[tensor_index][6, 1] ^= 1  # row 6 is unmapped
        r = cache_checks.check_quantized_cache("c", tuple(bad), (payload, scale), mapped, actual_values=ev,
                                               expected_values=ev, fmt=fmt)
        assert not r.ok, f"unmapped {label} byte flip passed"
    r = cache_checks.check_quantized_cache("c", (payload, scale), (payload, scale), mapped,
                                           actual_values=_nan_at(ev, math.nan, row=4), expected_values=ev, fmt=fmt)
    assert not r.ok, "a NaN on a mapped row passed"


def test_state_comparator_bound_and_untouched_bytes():
    """Touched ring rows within 0.5 % relative L2; untouched rows byte-identical. Spec: §4.1 (compare_state)."""
    e = torch.ones((6, 64), dtype=torch.float32)
    touched = torch.tensor([True, True, False, False, True, False])
    limit = cache_checks.STATE_MAX_REL_L2
    for f, want in ((1 - 1e-4, True), (1 + 1e-4, False)):
        a = e.double().clone()
        a[touched] += f * limit * math.sqrt(6 / 3) * _alt(64)  # the budget is over the whole state
        r = cache_checks.check_state("state", a.float(), e, touched)
        assert r.ok is want, f"state at {f} x {limit}: {r.message()}"
    a = e.clone()
    a.view(torch.int32)[3, 5] ^= 1
    assert not cache_checks.check_state("state", a, e, touched).ok, "an untouched ring slot's ulp passed"


def test_topk_cutoff_tolerance_and_overlap():
    """A selection that swaps the cutoff row passes when the score gap is within 5e-5 + 1.5e-2|missing| and
    fails just outside; set overlap passes at 98 % and fails below. Spec: §5.3."""
    n = 8
    table = torch.tensor([[0]], dtype=torch.int32)
    ctx = TopKContext(table, torch.tensor([0]), torch.tensor([n]), 128)
    for f, want in ((1 - 1e-4, True), (1 + 1e-4, False)):
        miss = 1.0
        extra = miss - f * (5e-5 + 1.5e-2 * miss)
        scores = torch.tensor([[5.0, 4.0, 3.0, miss, extra, -1.0, -2.0, -3.0]])
        expected = torch.tensor([[0, 1, 2, 3]], dtype=torch.int32)
        actual = torch.tensor([[0, 1, 2, 4]], dtype=torch.int32)
        r = check_topk_validity(actual, expected, ctx, scores)
        assert r.ok is want, f"cutoff gap at {f} x tolerance: {r.message()}"
    base = torch.arange(100, dtype=torch.int32).reshape(1, 100)
    for swapped, want in ((2, True), (3, False)):
        a = base.clone()
        a[0, :swapped] += 1000
        assert check_topk_overlap(a, base).ok is want, f"{swapped} of 100 rows differ"


@pytest.mark.operators("check_row_precision")
def test_replay_comparators_exact_and_masked_scores():
    """``exact`` compares bytes (-0.0 vs 0.0 fails, same NaN passes); ``masked_scores`` needs the -inf mask
    exactly and the finite scores within the row bound. Spec: §7.3, §5.1."""
    ctx = compare.Context({}, {}, {}, {})
    a = torch.tensor([[0.0, 1.0]])
    b = torch.tensor([[-0.0, 1.0]])
    assert not compare.exact("x", a, b, ctx).ok and compare.exact("x", a, a.clone(), ctx).ok
    s = torch.tensor([[1.0, -math.inf, 2.0]] * 2)
    t = s.clone()
    t[1, 1] = -1e30
    assert not compare.masked_scores("s", t, s, ctx).ok, "a finite score on a masked position passed"
    assert check_row_precision(s.nan_to_num(neginf=0.0), s.nan_to_num(neginf=0.0)).ok
    u = s.clone()
    u[0, 0] += 0.07  # RMS(e) of the row = 1.29 with the masked column as 0: peak bound 0.0645
    assert not compare.masked_scores("s", u, s, ctx).ok, "a finite score past the row bound passed"


def test_hc_mix_without_num_tokens_takes_the_active_rows_its_golden_names():
    """SP-04 / HC-11 on the replay comparator: coefficients of 4 rows whose last 2 are the zero tail, in a tree
    without num_tokens. The expected output names 2 active rows, so a stale 2^-30 in a tail row fails as a
    padding row; the capacity as the count (every row active) would judge it within ratio_allclose(2.5e-5, ..)
    and pass it. Spec: SP-04, HC-11."""
    e = torch.zeros(4, 3)
    e[:2] = torch.tensor([[0.5, -1.25, 2.0], [1.0, 0.75, -0.5]])
    a = e.clone()
    a[3, 1] = 2.0 ** -30
    from contracts.checks.attention import owner_active_rows

    count = owner_active_rows(e.reshape(1, 4, 3), inputs={})[0]
    separates("SP-04 hc_mix active rows", torch.tensor([count]), capacity=torch.tensor([4]))
    verdict = compare.hc_mix("post", a, e, compare.Context({}, {}, {}, {}))
    assert not verdict.ok and "padding row" in str(verdict), f"a stale tail row passed: {verdict}"
    assert compare.hc_mix("post", e.clone(), e, compare.Context({}, {}, {}, {})).ok
    every_row = compare.Context({"num_tokens": torch.tensor(4)}, {}, {}, {})
    assert compare.hc_mix("post", a, e, every_row).ok, "the capacity count fails the row too: not a separating vector"


def test_unchanged_storage_is_compared_byte_for_byte():
    """Non-owner storage (FP8 scales included) must keep every byte: one flipped bit, -0.0 for 0.0 and a
    different NaN payload fail; identical bytes (NaN included) pass. Spec: §6 (compare_unchanged), SP-21."""
    before = torch.randint(0, 256, (4, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    scales = before.view(torch.float8_e8m0fnu)
    assert cache_checks.check_unchanged("scale", scales, scales.clone()).ok
    flipped = before.clone()
    flipped[2, 3] ^= 0x10
    assert not cache_checks.check_unchanged("scale", scales, flipped.view(torch.float8_e8m0fnu)).ok
    f = torch.zeros(2, 4)
    g = f.clone()
    g[1, 2] = -0.0
    assert not cache_checks.check_unchanged("state", f, g).ok, "-0.0 for 0.0 passed"
    n = torch.full((1, 2), math.nan)
    m = n.clone()
    m.view(torch.int32)[0, 1] ^= 1
    assert cache_checks.check_unchanged("state", n, n.clone()).ok and not cache_checks.check_unchanged("state", n, m).ok


# ---------------------------------------------------------------------------
# evidence: what a failed result reports (counts, the worst row and column, the clause)


def _evidence_cases():
    e3 = _alt(64).repeat(6, 1).reshape(2, 3, 64)
    nan = e3.clone()
    nan[1, 2, 5] = math.nan
    nan[0, 1] += 1.0  # a second bad row: the non-finite one is reported first
    two = e3.clone()
    two[0, 2] += 0.03 * _alt(64).flip(0)  # RMS excess 3x
    two[1, 0] += 0.09 * _alt(64).flip(0)  # RMS excess 9x: the worst
    peak = e3.clone()
    peak[1, 1, 7] -= 0.2  # peak excess 4x at column 7 (RMS inside)
    b = _ones(6, 8)
    bad_b = b.clone()
    bad_b[2, 1] += 0.05 * math.sqrt(8)  # row 2 at 5 %
    bad_b[4, 1] += 0.10 * math.sqrt(8)  # row 4 at 10 %: the worst
    zero = b.clone()
    zero[3] = 0.0
    zero_a = zero.clone()
    zero_a[3, 6] = 1e-9
    nan_b = _nan_at(b, math.inf, row=5, col=2)
    slabs = [b[0:3].clone(), torch.cat([b[3:5], torch.zeros((1, 8), dtype=F64)])]
    slabs[1][2, 4] = 0.5
    reps = [b.float(), b.float().clone(), b.float().clone()]
    reps[2][1, 3:6] += 1.0
    signed = [b.float(), b.float().clone()]
    signed[0][2, 2] = 0.0
    signed[1][2, 2] = -0.0
    nan2 = _nan_at(_nan_at(b, math.inf, row=5, col=2), math.nan, row=1, col=0)
    e_nan = _nan_at(e3.reshape(6, 64), math.nan, row=4, col=9)
    mixed = _ones(2, 64)
    mixed[1] *= 10.0
    mixed_a = mixed.clone()
    mixed_a[0] += 0.03 * _alt(64)  # row 0: RMS excess 3 (bound 0.01), peak 0.6
    mixed_a[1] += 0.2 * _alt(64)  # row 1: RMS excess 2 (bound 0.1), peak excess 0.4; max picks row 0, min row 1
    mixed_a[1, 0] += 0.55  # row 1 peak 0.75 / 0.5 = 1.5
    pads = [b[0:3].clone(), torch.cat([b[3:4], torch.zeros((2, 8), dtype=F64)])]
    pads[1][1, 4] = 0.5
    pads[1][2, 6] = 0.25
    z3 = torch.ones((2, 3, 8), dtype=F64)
    z3[1, 2] = 0.0
    z3a = z3.clone()
    z3a[1, 2, 3] = 1e-9
    return {  # (operator, args, kwargs) -> (n_checked, n_failed, field, index, text in the message)
        "row precision: shape": (("check_row_precision", (e3[0], e3[1:]), {}), (1, 1, "output.shape", (), "")),
        "row precision: non-finite first": (("check_row_precision", (nan, e3), {}),
                                            (6, 2, "output", (1, 2, 5), "non-finite")),
        "row precision: worst RMS row": (("check_row_precision", (two, e3), {}), (6, 2, "output row", (1, 0), "RMS")),
        "row precision: worst peak column": (("check_row_precision", (peak, e3), {}),
                                             (6, 1, "output row", (1, 1), "column 7")),
        "budget: non-finite": (("check_output_budget", (nan_b, b), {}), (6, 1, "output", (5, 2), "non-finite")),
        "budget: zero reference row": (("check_output_budget", (zero_a, zero), {}),
                                       (6, 1, "output row", (3,), "exactly zero")),
        "budget: worst row": (("check_output_budget", (bad_b, b), {}), (6, 2, "output row", (4,), "row relative")),
        "split: num_tokens": (("check_active_split", (b, b, 7), {}), (1, 1, "num_tokens", (), "")),
        "owner rows: padding": (("check_owner_rows", (slabs, b[:5], [(0, 3, 3), (3, 2, 3)]), {}),
                                (1, 1, "output.rank1 padding row", (2, 4), "exactly zero")),
        "owner rows: rank count": (("check_owner_rows", (slabs[:1], b, [(0, 3, 3), (3, 2, 3)]), {}),
                                   (1, 1, "output.ranks", (), "")),
        "replicas: three values": (("check_replicas_identical", (reps,), {}), (3, 3, "output.replica2", (1, 3), "")),
        "replicas: none": (("check_replicas_identical", ([],), {}), (1, 1, "output.replicas", (), "")),
        "replicas: dtype": (("check_replicas_identical", ([reps[0], reps[1].double()],), {}),
                            (2, 1, "output.replica1", (), "")),
        "replicas: equal values, other bytes": (("check_replicas_identical", (signed,), {}),
                                                (2, 1, "output.replica1", (2, 2), "bytes differ")),
        "row precision: dtype": (("check_row_precision", (e3.float(), e3), {}), (1, 1, "output.dtype", (), "")),
        "row precision: empty": (("check_row_precision", (e3[:0], e3[:0]), {}), (1, 1, "output.numel", (), "")),
        "row precision: NaN in the reference": (("check_row_precision", (e3.reshape(6, 64), e_nan), {}),
                                                (6, 1, "output", (4, 9), "non-finite")),
        "row precision: worst by ratio, not by product": (("check_row_precision", (mixed_a, mixed), {}),
                                                          (2, 2, "output row", (0,), "RMS")),
        "budget: two non-finite rows": (("check_output_budget", (nan2, b), {}), (6, 2, "output", (1, 0), "non-finite")),
        "budget: zero reference row, 3-D": (("check_output_budget", (z3a, z3), {}),
                                            (6, 1, "output row", (1, 2), "exactly zero")),
        "split: shape": (("check_active_split", (b[:5], b, 2), {}), (1, 1, "output.shape", (), "")),
        "owner rows: rank rows": (("check_owner_rows", ([b[0:3], b[3:4]], b[:4], [(0, 3, 3), (3, 1, 3)]), {}),
                                  (1, 1, "output.rank1.rows", (), "")),
        "owner rows: two padding rows": (("check_owner_rows", (pads, b[:4], [(0, 3, 3), (3, 1, 3)]), {}),
                                         (2, 2, "output.rank1 padding row", (1, 4), "exactly zero")),
    }


EVIDENCE = _evidence_cases()


@pytest.mark.operators("check_owner_rows")
def test_owner_rows_pass_reports_every_row_checked(backend):
    """A passing owner-row comparison counts every row it judged: the owned rows and the padding rows of
    every rank (a green result says how much ran). Spec: §6, §7.1."""
    b = _ones(5, 8)
    slabs = [b[0:3].clone(), torch.cat([b[3:5], torch.zeros((1, 8), dtype=F64)]), torch.zeros((3, 8), dtype=F64)]
    r = op(backend, "check_owner_rows")(slabs, b, [(0, 3, 3), (3, 2, 3), (5, 0, 3)])
    assert r.ok and r.n_checked == 9, f"{r.message()} (expected 9 rows: 5 owned, 4 padding)"
    r = op(backend, "check_owner_rows")([], b[:0], [])
    assert r.ok and r.n_checked == 0, r.message()


@pytest.mark.parametrize("case", operator_params(EVIDENCE, lambda row: row[0][0]))
def test_comparator_failure_names_counts_row_and_column(backend, case):
    """A failed result counts what it checked and what failed, and names the worst row (and column) and the
    clause: the evidence a kernel engineer reads first. Spec: §6."""
    (name, args, kwargs), (n_checked, n_failed, field, index, text) = EVIDENCE[case]
    r = op(backend, name)(*args, **kwargs)
    assert not r.ok, f"{case}: passed"
    got = (r.n_checked, r.n_failed, r.worst.field, tuple(r.worst.index))
    assert got == (n_checked, n_failed, field, index), f"{case}: (checked, failed, field, index) = {got}, " \
                                                       f"expected {(n_checked, n_failed, field, index)}"
    assert text in r.message(), f"{case}: {r.message()!r} does not say {text!r}"


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.operators("check_row_precision")
def test_row_verdict_equals_the_fp64_verdict_near_the_bound(backend, seed):
    """FP32 outputs are summed fast and re-judged in FP64 near the bound: 200 rows of 4096 built within
    +-2e-6 (relative) of the RMS bound each get the verdict of FP64 copies of the same values. (Judged with
    FP32 sums alone, about 1 row in 40 of these gets the other verdict.) Spec: §6 (FP64 rows)."""
    check = op(backend, "check_row_precision")
    g = torch.Generator().manual_seed(seed)
    e = (torch.randn((200, 4096), generator=g) * 3).float()
    direction = torch.randn((200, 4096), generator=g, dtype=F64)
    bound = 1e-6 + 0.01 * e.double().pow(2).mean(1, keepdim=True).sqrt()
    target = bound * (1 + torch.linspace(-2e-6, 2e-6, 200, dtype=F64).unsqueeze(1))
    a = (e.double() + direction / direction.pow(2).mean(1, keepdim=True).sqrt() * target).float()
    wrong = [r for r in range(200) if check(a[r:r + 1], e[r:r + 1]).ok != check(a[r:r + 1].double(),
                                                                                 e[r:r + 1].double()).ok]
    assert not wrong, f"rows {wrong[:8]}: the FP32 verdict differs from the FP64 one"


@pytest.mark.operators("check_row_precision")
def test_row_bound_fast_path_agrees_with_fp64_in_every_block(backend):
    """The row check decides clearly-good rows from FP32 statistics in concurrent row blocks and recomputes the
    rest in FP64. On 40,000 FP32 rows of 64 (several blocks): rows at 1 -/+ 1e-6 of the RMS and of the peak
    bound deep in later blocks, a NaN row, and rows of 1e30-magnitude values (whose FP32 squares overflow) get
    exactly the verdicts, counts and worst-row message of the same rows judged one at a time in FP64 (FP32
    inputs, so the near-bound rows keep their distance to the bound).
    Spec: §6 (FP64 rows)."""
    check = op(backend, "check_row_precision")
    g = torch.Generator().manual_seed(11)
    rows, width = 40_000, 64
    e = torch.randn((rows, width), generator=g)
    a = e + torch.randn((rows, width), generator=g) * 1e-4
    big = 31_000
    e[big] = torch.randn(width, generator=g) * 1e30
    a[big] = e[big]
    a[big, 7] = e[big, 7] * (1 + 2.0**-7)  # well within the peak bound
    assert check(a, e).ok, check(a, e).message()
    assert check(a[big:big + 1].double(), e[big:big + 1].double()).ok
    a[39_999, 5] = float("nan")
    verdict = check(a, e)
    assert not verdict.ok and verdict.n_failed == 1 and "[39999][5]" in verdict.message(), verdict.message()
    a[39_999, 5] = e[39_999, 5]
    for row, scale in ((20_001, 1.0 + 1e-6), (33_333, 1.0 - 1e-6)):  # RMS error at the bound, from both sides
        ref = e[row].double()
        bound = 1e-6 + 0.01 * ref.pow(2).mean().sqrt()
        direction = torch.ones(width, dtype=F64)
        a[row] = (ref + direction * bound * scale).float()
    exact = [check(a[r:r + 1].double(), e[r:r + 1].double()) for r in (20_001, 33_333)]
    verdict = check(a, e)
    assert verdict.n_failed == sum(not v.ok for v in exact), (verdict.message(), [v.message() for v in exact])
    if not verdict.ok:
        worst = next(v for v in exact if not v.ok)
        assert worst.worst.describe().split("row", 1)[1].split("=")[1] in verdict.message(), verdict.message()


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
@pytest.mark.operators("check_row_precision")
def test_a_row_over_the_peak_bound_alone_fails_among_good_rows(backend, scale):
    """Wide rows (D = 64) where one element is off by 1.05x the peak bound while the row's RMS error stays under
    the RMS bound, at RMS(e) scales 1e-3, 1 and 1e3, among 2,000 good rows: the row fails by the peak clause,
    named with its column; a row whose sign is flipped fails too. (The fast FP32 statistics may only spare
    rows that are clearly within both clauses.) Spec: §6."""
    check = op(backend, "check_row_precision")
    g = torch.Generator().manual_seed(7)
    e = torch.randn((2000, 64), generator=g) * scale
    a = e + torch.randn((2000, 64), generator=g) * scale * 1e-4
    ref_rms = float(e[1234].double().pow(2).mean().sqrt())
    a[1234] = e[1234]
    a[1234, 17] = e[1234, 17] + 1.05 * (1e-5 + 0.05 * ref_rms)
    verdict = check(a, e)
    assert not verdict.ok and verdict.n_failed == 1, verdict.message()
    assert "row[1234]" in verdict.message() and "max|a-e| at column 17" in verdict.message(), verdict.message()
    flipped = e.clone()
    flipped[321] = -e[321]
    verdict = check(flipped, e)
    assert not verdict.ok and "row[321]" in verdict.message(), verdict.message()


@pytest.mark.operators("check_row_precision")
def test_bf16_rows_just_over_the_bound_fail_and_just_under_pass(backend):
    """BF16 rows whose FP64 excess over the RMS or peak bound lies within 0.5 % of 1 (kept from 20,000 random
    candidates), judged together: every row over 1 fails and every row under passes, exactly as each row judged
    alone in FP64 -- the fast statistics may not clear a row this close. Spec: §6 (FP64 rows)."""
    check = op(backend, "check_row_precision")
    g = torch.Generator().manual_seed(23)
    n, width = 20_000, 256
    e = torch.randn((n, width), generator=g).to(torch.bfloat16)
    ref = e.double()
    rms_bound = 1e-6 + 0.01 * ref.pow(2).mean(1, keepdim=True).sqrt()
    spread = torch.randn((n, width), generator=g, dtype=F64)
    spread = spread / spread.pow(2).mean(1, keepdim=True).sqrt()
    a = (ref + spread * rms_bound * (0.99 + 0.02 * torch.rand((n, 1), generator=g, dtype=F64))).to(torch.bfloat16)
    diff = a.double() - ref
    excess = torch.maximum(diff.pow(2).mean(1).sqrt() / rms_bound.squeeze(1),
                           diff.abs().amax(1) / (1e-5 + 0.05 * ref.pow(2).mean(1).sqrt()))
    near = ((excess - 1).abs() < 0.005).nonzero().flatten()
    over, under = near[excess[near] > 1], near[excess[near] < 1]
    assert over.numel() > 20 and under.numel() > 20, (over.numel(), under.numel())
    rows = torch.cat((over, under))
    verdict = check(a[rows], e[rows])
    assert verdict.n_failed == over.numel(), f"{verdict.n_failed} rows failed, {over.numel()} are over the bound"
    assert check(a[under], e[under]).ok, check(a[under], e[under]).message()


@pytest.mark.operators("check_output_budget")
def test_bf16_outputs_near_the_budget_get_the_fp64_verdict(backend):
    """The FP8 budget on BF16 rows whose FP64 row relative L2 lies within 0.2 % of the 2 % bound (kept from 4,000
    random candidates): each row's verdict is the FP64 one -- norms taken in BF16 would misjudge rows this close.
    Spec: §6 (decode SWA/C2A compare_output, FP64 arithmetic)."""
    check = op(backend, "check_output_budget")
    g = torch.Generator().manual_seed(29)
    n, width = 4000, 512
    e = torch.randn((n, width), generator=g).to(torch.bfloat16)
    ref = e.double()
    noise = torch.randn((n, width), generator=g, dtype=F64)
    noise = noise / noise.norm(dim=1, keepdim=True) * ref.norm(dim=1, keepdim=True)
    a = (ref + noise * 0.02 * (0.995 + 0.01 * torch.rand((n, 1), generator=g, dtype=F64))).to(torch.bfloat16)
    rel = (a.double() - ref).norm(dim=1) / ref.norm(dim=1)
    near = ((rel / 0.02 - 1).abs() < 0.002).nonzero().flatten()[:200]
    assert near.numel() > 50, near.numel()
    exact = e[n - 15:]  # 15 exact rows keep the global relative L2 near 0.5 %: the row clause decides
    wrong, failing = [], 0
    for r in near.tolist():
        got = check(torch.cat((a[r:r + 1], exact)), torch.cat((e[r:r + 1], exact))).ok
        failing += not got
        if got != bool(rel[r] <= 0.02):
            wrong.append(r)
    assert not wrong, f"rows {wrong[:8]}: the BF16 verdict differs from the FP64 one"
    assert 0 < failing < near.numel(), failing


def test_a_chosen_tolerance_must_be_finite_and_in_range():
    """ratio_allclose budgets: atol / rtol finite and >= 0 (0 accepted), the outlier quota finite in [0, 1]
    (0 and 1 accepted); NaN, infinity, a negative value, a quota over 1 and a bool are refused naming the
    parameter -- a NaN atol would otherwise accept every element. Spec: CH-07."""
    from contracts.checks.precision import check_tolerances
    from kernels.errors import ContractInputError

    check_tolerances(atol=0, rtol=0, max_error_ratio=1)
    with pytest.raises(ContractInputError, match="max_error_ratio"):
        check_tolerances(atol=0, rtol=0, max_error_ratio=2)
    e = torch.ones(4, dtype=F64)
    for ok in (dict(atol=0.0, rtol=0.0), dict(atol=1e-2, rtol=0, max_error_ratio=1.0),
               dict(atol=1, rtol=1, max_error_ratio=0)):
        check_ratio_allclose(e, e, **{"max_error_ratio": 0.005, **ok})
    for bad, field in ((dict(atol=math.nan), "atol"), (dict(rtol=math.inf), "rtol"), (dict(atol=-1e-9), "atol"),
                       (dict(max_error_ratio=1.01), "max_error_ratio"), (dict(max_error_ratio=-0.1), "max_error_ratio"),
                       (dict(max_error_ratio=math.nan), "max_error_ratio"), (dict(rtol=True), "rtol")):
        with pytest.raises(ContractInputError, match=field):
            check_ratio_allclose(e, e, **{"atol": 1e-2, "rtol": 1e-2, **bad})


def test_the_resident_sentinels_fail_on_any_written_byte_and_list_every_one():
    """CQ-24: 2 ranks, 3 layers of 4 window pages, a global cache of 2 slots using 5 and 8 of 8 rows. All-zero
    sentinels pass, and the used rows may hold anything. One byte of layer 1's last page on rank 1 fails naming
    it; a -0.0 in slot 0's row 5 fails (a write, though it equals zero: a value comparison would pass it);
    the last used row of slot 0 (row 4) written passes; both faults at once are both listed."""
    from contracts.checks.cache import check_resident_sentinels

    window = torch.zeros(2, 3, 4, 16, dtype=torch.uint8)
    window[:, :, :3] = 7  # pages in use
    cache = torch.zeros(2, 2, 8, 4)
    cache[:, 0, :5] = 1.5
    cache[:, 1] = 2.0  # slot 1 uses every row: no sentinel there
    used = {"global_cache": (cache, [5, 8])}
    assert check_resident_sentinels(window, used).ok
    w = window.clone()
    w[1, 1, 3, 9] = 1
    r = check_resident_sentinels(w, used)
    assert not r.ok and "window_sentinel_1 rank1" in r.message() and "row[9]" in r.message(), r.message()
    c = cache.clone()
    c[0, 0, 5, 2] = -0.0
    assert bool((c[0, 0, 5:] == 0).all())  # the value comparison's reading: still zero
    r = check_resident_sentinels(window, {"global_cache": (c, [5, 8])})
    assert not r.ok and "global_cache_sentinel_0 rank0" in r.message(), r.message()
    c2 = cache.clone()
    c2[1, 0, 4] = 9.0
    assert check_resident_sentinels(window, {"global_cache": (c2, [5, 8])}).ok
    r = check_resident_sentinels(w, {"global_cache": (c, [5, 8])})
    assert r.n_failed == 2 and "window_sentinel_1, global_cache_sentinel_0" in r.message(), r.message()
    r = check_resident_sentinels(window, {"global_cache": (cache, [5])})
    assert not r.ok and "one per slot (2)" in r.message(), r.message()
