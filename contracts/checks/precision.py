"""Precision comparators of the V4.1 kernels, as pure checks.

All arithmetic is FP64 on upcast copies, so BF16/FP16/FP32 (and FP8) inputs compare
without ``torch.allclose``. A row is every leading index of the tensor (one token on one
rank); messages name the worst row, its error and its bound.

Spec: §6 (comparator table), §7.1 (owner rows), upstream_checks §15 C-4 (variants).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch

from contracts.result import Bound, CheckResult, Violation, failed, first_failure, passed
from contracts.tensors import byte_view
from contracts.tolerances import (
    BF16_STAGE_ROW_BUDGET,
    BF16_STAGE_TOL,
    DSPARK_X_OUT_QUOTA,
    DSPARK_X_OUT_TOL,
    ENGRAM_TOL,
    FP8_BUDGET,
    FP32_ULPS,
    HC_MIX_TOL,
    HC_OUT_TOL,
    LOGITS_TOL,
    MXFP8_ACTIVATION_TOL,
    QR_SCALE_TOL,
    ROW_BOUND,
    V4_ATTN_OUT_QUOTA,
    V4_ATTN_OUT_TOL,
    V4_CMP_POOL_TOL,
    V4_CP_KV_QUOTA,
    V4_CP_KV_TOL,
    V4_CP_X_OUT_RELDIFF,
    V4_KV_POOL_RELDIFF,
    V4_PREFILL_MTP_RELDIFF,
    V4_STATE_POOL_TOL,
    OutputBudget,
    RowBound,
)
from kernels import workers
from kernels.errors import ContractInputError
from kernels.operators import operator

Leaf = Callable[..., CheckResult]




def _row_index(row: int, lead_shape: tuple[int, ...]) -> tuple[int, ...]:
    if not lead_shape:
        return ()
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(row), lead_shape))


def _pair_problem(check: str, spec: str, name: str, actual: torch.Tensor, expected: torch.Tensor
                  ) -> CheckResult | None:
    if tuple(actual.shape) != tuple(expected.shape):
        return failed(check, spec, 1, 1, Violation(f"{name}.shape", (), tuple(actual.shape), tuple(expected.shape)))
    if actual.dtype != expected.dtype:
        return failed(check, spec, 1, 1, Violation(f"{name}.dtype", (), actual.dtype, expected.dtype))
    if actual.numel() == 0:
        return failed(check, spec, 1, 1, Violation(f"{name}.numel", (), 0, "> 0"))
    return None


def _lead(actual: torch.Tensor) -> tuple[int, ...]:
    """The leading shape a row index is reported in (none for a 1-D tensor: one row)."""
    return tuple(actual.shape[:-1]) if actual.ndim > 1 else ()


def _pair64(check: str, spec: str, name: str, actual: torch.Tensor, expected: torch.Tensor
            ) -> tuple[CheckResult | None, torch.Tensor, torch.Tensor]:
    """The pair's layout problem (or None) and both sides as FP64 on the CPU."""
    f64 = lambda t: t.detach().cpu().to(torch.float64)  # noqa: E731
    return _pair_problem(check, spec, name, actual, expected), f64(actual), f64(expected)


def _valid_rows_problem(check: str, spec: str, name: str, a: torch.Tensor, valid_rows, zero_tail: bool, *,
                        dim: int) -> CheckResult | None:
    """``valid_rows`` outside 0 .. the token rows (dimension ``dim``) of ``a``, or -- with ``zero_tail`` -- a
    nonzero element after them, as a failure naming it; None when the rows may be judged."""
    rows = a.shape[dim]
    if isinstance(valid_rows, bool) or not 0 <= valid_rows <= rows:
        return failed(check, spec, 1, 1, Violation(f"{name}.valid_rows", (), valid_rows, f"0..{rows}"))
    tail = a.narrow(dim, valid_rows, rows - valid_rows)
    if zero_tail and bool((tail != 0).any()):
        where = (tail != 0).nonzero()[0].tolist()
        where[dim] += valid_rows
        n_pad = int((tail != 0).sum())
        return failed(check, spec, tail.numel(), n_pad,
                      Violation(f"{name} padding row", tuple(where), float(a[tuple(where)]), 0.0,
                                note=f"{n_pad} nonzero padding elements after the {valid_rows} valid rows"))
    return None


def _norm(t: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """L2 norm without under/overflow: scaled by the largest magnitude first (1e-300 rows keep their norm)."""
    top = t.abs().amax() if dim is None else t.abs().amax(dim=dim, keepdim=True)
    safe = torch.where(top > 0, top, torch.ones_like(top))
    n = (t / safe).norm() if dim is None else (t / safe).norm(dim=dim)
    return n * (safe if dim is None else safe.squeeze(dim))


def _native_rows(t: torch.Tensor) -> torch.Tensor:
    """[rows, D] in the tensor's own dtype (the row bound converts block by block)."""
    t = t.detach().cpu()
    return t.reshape(1, -1) if t.ndim <= 1 else t.reshape(-1, t.shape[-1])


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[rows, D] in FP64."""
    return _native_rows(t).to(torch.float64)


ROW_BLOCK_ELEMENTS = 1 << 20  # rows are judged in concurrent blocks of about this many elements


def _exact_row_stats(a: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(finite, err_rms, err_peak, ref_rms) of rows [n, D] in FP64, any value allowed: a non-finite difference
    counts as +inf and a non-finite reference element as 0 (the row is reported as non-finite anyway)."""
    a, e = a.to(torch.float64), e.to(torch.float64)
    finite = torch.isfinite(a).all(dim=1) & torch.isfinite(e).all(dim=1)
    diff = (a - e).nan_to_num(nan=math.inf, posinf=math.inf, neginf=math.inf)
    ref_rms = e.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).pow(2).mean(dim=1).sqrt()
    return finite, diff.pow(2).mean(dim=1).sqrt(), diff.abs().amax(dim=1), ref_rms


def _fp32_row_stats(a: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(err_rms, err_peak, ref_rms) of a block of rows computed in FP32, each within a relative error of
    ``_fp32_margin(D)`` of the FP64 value when finite (a non-finite result marks a row to recompute)."""
    a32, e32 = a.to(torch.float32), e.to(torch.float32)
    diff = a32 - e32
    root_n = math.sqrt(a.shape[1])
    err_rms = torch.linalg.vector_norm(diff, dim=1) / root_n
    ref_rms = torch.linalg.vector_norm(e32, dim=1) / root_n
    err_peak = torch.linalg.vector_norm(diff, ord=math.inf, dim=1)
    return err_rms.double(), err_peak.double(), ref_rms.double()


def _fp32_margin(width: int) -> float:
    """A bound on the relative error of the FP32 row statistics: the difference, square and each of the D - 1
    additions round once (2^-24 each), the square root halves the sum's error, the division by sqrt(D) rounds
    once more; doubled for the ratio of two such values."""
    return 4.0 * (width + 3) * 2.0**-24


def _row_stats(a: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Approximate per-row (err_rms, err_peak, ref_rms) of [rows, D] pairs in FP32, in concurrent row blocks
    (each row's reductions run over that row alone, so the blocking changes no value)."""
    rows = a.shape[0]
    step = max(1, ROW_BLOCK_ELEMENTS // max(a.shape[1], 1))
    if rows <= step:
        return _fp32_row_stats(a, e)
    parts = list(workers.pool().map(lambda i: _fp32_row_stats(a[i:i + step], e[i:i + step]), range(0, rows, step)))
    return tuple(torch.cat([p[k] for p in parts]) for k in range(3))


@operator(returns='CheckResult', spec='§6')
def check_row_precision(actual: torch.Tensor, expected: torch.Tensor, *, bound: RowBound = ROW_BOUND,
                        name: str = "output") -> CheckResult:
    """Every row: RMS and peak error within the row bound; any non-finite value fails; no outlier quota.

    ``actual``/``expected`` [..., D] with equal shape and dtype, numel > 0. All arithmetic in FP64. Spec: §6.
    """
    check, spec = "check_row_precision", "§6"
    if (problem := _pair_problem(check, spec, name, actual, expected)) is not None:
        return problem
    a, e = _native_rows(actual), _native_rows(expected)
    lead, n_rows = _lead(actual), a.shape[0]
    if a.dtype == torch.float64 or e.dtype == torch.float64:  # FP64 inputs: every row judged in FP64
        judged = torch.arange(n_rows)
    else:
        # FP32 statistics only clear the rows that are within both clauses by more than their worst-case error;
        # every other row (near or over the bound, non-finite) is judged from its FP64 statistics below
        err_rms, err_peak, ref_rms = _row_stats(a, e)
        excess = torch.maximum(err_rms / (bound.rms_atol + bound.rms_rtol * ref_rms),
                               err_peak / (bound.peak_atol + bound.peak_rtol * ref_rms))
        judged = (~(excess < 1.0 - _fp32_margin(a.shape[1]))).nonzero().flatten()  # NaN excess included
    if judged.numel() == 0:
        return passed(check, spec, n_rows)
    finite, err_rms, err_peak, ref_rms = _exact_row_stats(a[judged], e[judged])
    rms_bound = bound.rms_atol + bound.rms_rtol * ref_rms
    peak_bound = bound.peak_atol + bound.peak_rtol * ref_rms
    rms_excess = err_rms / rms_bound
    peak_excess = err_peak / peak_bound
    bad = ~finite | (err_rms > rms_bound) | (err_peak > peak_bound)
    if not bool(bad.any()):
        return passed(check, spec, n_rows)
    nonfinite = (~finite).nonzero().flatten()
    if nonfinite.numel():
        k = int(nonfinite[0])
        row = int(judged[k])
        ar, er = a[row].to(torch.float64), e[row].to(torch.float64)
        col = int((~torch.isfinite(ar) | ~torch.isfinite(er)).nonzero()[0, 0])
        worst = Violation(name, (*_row_index(row, lead), col), float(ar[col]), float(er[col]),
                          note=f"non-finite value in row {_row_index(row, lead) or row}")
        return failed(check, spec, n_rows, int(bad.sum()), worst)
    score = torch.maximum(rms_excess, peak_excess).masked_fill(~bad, -1.0)
    k = int(score.argmax())
    row = int(judged[k])
    idx = _row_index(row, lead)
    if rms_excess[k] >= peak_excess[k]:
        worst = Violation(f"{name} row", idx, float(err_rms[k]), 0.0, float(rms_bound[k]),
                          note=f"RMS(a-e) > {bound.rms_atol:g} + {bound.rms_rtol:g}*RMS(e={float(ref_rms[k]):.6g})")
    else:
        ar, er = a[row].to(torch.float64), e[row].to(torch.float64)
        col = int((ar - er).abs().argmax())
        worst = Violation(f"{name} row", idx, float(err_peak[k]), 0.0, float(peak_bound[k]),
                          note=f"max|a-e| at column {col} (a={float(ar[col]):.6g}, e={float(er[col]):.6g}) "
                               f"> {bound.peak_atol:g} + {bound.peak_rtol:g}*RMS(e={float(ref_rms[k]):.6g})")
    return failed(check, spec, n_rows, int(bad.sum()), worst)


@operator(returns='CheckResult', spec='§6')
def check_output_budget(actual: torch.Tensor, expected: torch.Tensor, *, budget: OutputBudget = FP8_BUDGET,
                        name: str = "output") -> CheckResult:
    """Finite; global rel L2 <= 1 %; every row rel L2 <= 2 %; cosine >= 0.9999 (waived for a zero reference);
    rows whose reference is all zero must be exactly zero. Spec: §6 (decode SWA/C2A compare_output).
    """
    check, spec = "check_output_budget", "§6"
    if (problem := _pair_problem(check, spec, name, actual, expected)) is not None:
        return problem
    a, e = _rows(actual), _rows(expected)
    lead, n_rows = _lead(actual), a.shape[0]
    bad_elems = ~torch.isfinite(a) | ~torch.isfinite(e)
    if bool(bad_elems.any()):
        row, col = (int(v) for v in bad_elems.nonzero()[0])
        return failed(check, spec, n_rows, int(bad_elems.any(dim=1).sum()),
                      Violation(name, (*_row_index(row, lead), col), float(a[row, col]), float(e[row, col]),
                                note="non-finite value"))
    diff_norm = _norm(a - e, 1)
    ref_norm = _norm(e, 1)
    zero_ref = ref_norm == 0
    nonzero_on_zero = zero_ref & (a != 0).any(dim=1)
    if bool(nonzero_on_zero.any()):
        row = int(nonzero_on_zero.nonzero()[0, 0])
        return failed(check, spec, n_rows, int(nonzero_on_zero.sum()),
                      Violation(f"{name} row", _row_index(row, lead), float(a[row].abs().max()), 0.0, 0.0,
                                note="reference row is all zero, so the output row must be exactly zero"))
    row_rel = torch.where(zero_ref, torch.zeros_like(diff_norm),
                          diff_norm / torch.where(zero_ref, torch.ones_like(ref_norm), ref_norm))
    over = row_rel > budget.row_rel_l2
    if bool(over.any()):
        row = int(row_rel.argmax())
        return failed(check, spec, n_rows, int(over.sum()),
                      Violation(f"{name} row", _row_index(row, lead), float(row_rel[row]), 0.0,
                                budget.row_rel_l2, note="row relative L2"))
    total_ref = float(_norm(e))
    if total_ref > 0:
        global_rel = float(_norm(a - e)) / total_ref
        if global_rel > budget.global_rel_l2:
            return failed(check, spec, n_rows, n_rows,
                          Violation(name, (), global_rel, 0.0, budget.global_rel_l2, note="global relative L2"))
        # scale-free cosine: dividing by the norms first keeps tiny (even subnormal) outputs exact
        an, en = _norm(a), _norm(e)
        cosine = float(((a / an) * (e / en)).sum()) if float(an) > 0 else 0.0
        if cosine < budget.min_cosine:
            return failed(check, spec, n_rows, n_rows,
                          Violation(name, (), cosine, f">= {budget.min_cosine}", None, note="cosine similarity"))
    return passed(check, spec, n_rows)


def check_tolerances(*, atol: float, rtol: float, max_error_ratio: float) -> None:
    """A ratio_allclose budget a caller chose: atol and rtol finite and >= 0, the outlier quota finite in
    [0, 1]; anything else is an error naming the parameter (a NaN tolerance would pass everything). Spec:
    upstream_checks CH-07."""
    for name, value, high in (("atol", atol, math.inf), ("rtol", rtol, math.inf),
                              ("max_error_ratio", max_error_ratio, 1.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value <= high:
            raise ContractInputError(name, None, "a finite number >= 0" + (" and <= 1" if high == 1.0 else ""),
                                     repr(value), "CH-07")


def check_ratio_allclose(actual: torch.Tensor, expected: torch.Tensor, *, atol: float, rtol: float,
                         max_error_ratio: float = 0.005, valid_rows: int | None = None, zero_tail: bool = False,
                         name: str = "output") -> CheckResult:
    """Older comparator: ``|a-e| <= atol + rtol*|e|`` with at most ``max_error_ratio`` of elements failing;
    NaN/Inf always fail. With ``valid_rows`` only the first ``valid_rows`` token rows (dim -2) are judged and the
    quota counts their elements only; with ``zero_tail`` every later row of ``actual`` must be exactly zero.
    Spec: §6 (`ratio_allclose`), upstream_checks §15 C-4, CH-20, AP-13.
    """
    check, spec = "check_ratio_allclose", "§6"
    check_tolerances(atol=atol, rtol=rtol, max_error_ratio=max_error_ratio)
    problem, a, e = _pair64(check, spec, name, actual, expected)
    if problem is not None:
        return problem
    if valid_rows is not None:
        if a.ndim < 2:  # no token rows to choose from
            return failed(check, spec, 1, 1, Violation(f"{name}.valid_rows", (), valid_rows, "0..0"))
        problem = _valid_rows_problem(check, spec, name, a, valid_rows, zero_tail, dim=a.ndim - 2)
        if problem is not None:
            return problem
        a, e = a[..., :valid_rows, :], e[..., :valid_rows, :]
    n = a.numel()
    nonfinite = ~torch.isfinite(a) | ~torch.isfinite(e)
    allowed = atol + rtol * e.abs()
    excess = ((a - e).abs() - allowed).nan_to_num(nan=math.inf)
    bad = (excess > 0) | nonfinite
    n_bad = int(bad.sum())
    if n_bad == 0:
        return passed(check, spec, n)
    flat = int(torch.where(nonfinite, torch.full_like(excess, math.inf), excess).flatten().argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
    worst = Violation(name, idx, float(a[idx]), float(e[idx]), float(allowed[idx]),
                      note=f"{n_bad}/{n} elements out of atol={atol:g}, rtol={rtol:g}; quota {max_error_ratio:g}")
    if bool(nonfinite.any()) or n_bad > max_error_ratio * n:
        return failed(check, spec, n, n_bad, worst)
    return passed(check, spec, n)


def check_ratio_reldiff(actual: torch.Tensor, expected: torch.Tensor, *, diff_thd: float, pct_thd: float,
                        max_diff: float = math.inf, valid_rows: int | None = None, zero_tail: bool = False,
                        name: str = "output") -> CheckResult:
    """Upstream's ratio_reldiff (cann-recipes-infer's data_compare): per element d = |a - e| and
    r = d if d < diff_thd else d / (max(|a|, |e|, 2^-14 / diff_thd) + 1e-9); an element is bad when
    r > diff_thd; pass iff bad / n <= pct_thd and every bad r < max_diff. An absolute difference below diff_thd
    never counts; the floor 2^-14 / diff_thd only bounds r (it matters to max_diff). NaN / Inf in either side
    fail. With ``valid_rows`` only the first token rows (dim 0) are judged; with ``zero_tail`` every later row of
    ``actual`` must be exactly 0. Spec: §8 (upstream prefill_mtp.py's hidden_out / pre_hc_hidden_out)."""
    check, spec = "check_ratio_reldiff", "§8"
    for pname, value, ok in (("diff_thd", diff_thd, lambda v: math.isfinite(v) and v > 0),
                             ("pct_thd", pct_thd, lambda v: 0 <= v <= 1), ("max_diff", max_diff, lambda v: v > 0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or not ok(value):
            raise ContractInputError(pname, None, "a number > 0 (diff_thd finite, pct_thd in [0, 1])", repr(value),
                                     spec)
    problem, a, e = _pair64(check, spec, name, actual, expected)
    if problem is not None:
        return problem
    if valid_rows is not None:
        if not isinstance(valid_rows, int):
            return failed(check, spec, 1, 1, Violation(f"{name}.valid_rows", (), valid_rows, f"0..{a.shape[0]}"))
        problem = _valid_rows_problem(check, spec, name, a, valid_rows, zero_tail, dim=0)
        if problem is not None:
            return problem
        a, e = a[:valid_rows], e[:valid_rows]
    n = a.numel()
    if n == 0:
        return passed(check, spec, 0)
    nonfinite = ~torch.isfinite(a) | ~torch.isfinite(e)
    d = (a - e).abs()
    floor = 2.0**-14 / diff_thd
    r = torch.where(d < diff_thd, d, d / (torch.maximum(torch.maximum(a.abs(), e.abs()), torch.tensor(floor)) + 1e-9))
    r = torch.where(nonfinite, torch.full_like(r, math.inf), r)
    bad = r > diff_thd
    n_bad = int(bad.sum())
    if n_bad == 0:
        return passed(check, spec, n)
    flat = int(r.flatten().argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
    worst = Violation(name, idx, float(a[idx]), float(e[idx]), diff_thd,
                      note=f"{n_bad}/{n} elements with relative diff > {diff_thd:g} (quota {pct_thd:g}); "
                           f"worst {float(r[idx]):.4g} (cap {max_diff:g})")
    if bool(nonfinite.any()) or n_bad > pct_thd * n or float(r[idx]) >= max_diff:
        return failed(check, spec, n, n_bad, worst)
    return passed(check, spec, n)


def check_owned_rows(actual: torch.Tensor, expected: torch.Tensor, before: torch.Tensor, *, atol: float = 0.0,
                     rtol: float = 0.0, name: str = "pool", leaf: Leaf | None = None) -> CheckResult:
    """An in-out pool [..., width]: the rows the reference wrote (expected differs from ``before`` there) within
    ratio_allclose(atol, rtol) with no quota -- or ``leaf`` when given --, and every other row byte for byte as
    it was (a written row the reference left alone is a failure however small). Spec: §8 (upstream's cmp_kv /
    compress_state compare_fn, no error quota; mapped_pool_ratio_reldiff with a leaf)."""
    check, spec = "check_owned_rows", "§8"
    problem = _pair_problem(check, spec, name, actual, expected)
    if problem is not None:
        return problem
    if before.shape != expected.shape or before.dtype != expected.dtype:
        return failed(check, spec, 1, 1, Violation(f"{name}.before", (), f"{before.dtype}{list(before.shape)}",
                                                   f"{expected.dtype}{list(expected.shape)}"))
    width = expected.shape[-1]
    a, e, b = (byte_view(v.contiguous()).reshape(-1, width * v.element_size()) for v in (actual, expected, before))
    owned = (e != b).any(1)
    moved = (a != b).any(1) & ~owned
    if bool(moved.any()):
        r = int(moved.nonzero()[0])
        return failed(check, spec, int((~owned).sum()), int(moved.sum()),
                      Violation(f"{name} row", (r,), "written", "kept byte for byte",
                                note=f"{int(moved.sum())} row(s) the reference did not write were changed"))
    rows = lambda v: v.reshape(-1, width)[owned]  # noqa: E731
    if leaf is not None:
        return leaf(rows(actual), rows(expected), name=name)
    return check_ratio_allclose(rows(actual), rows(expected), atol=atol, rtol=rtol, max_error_ratio=0.0, name=name)


def check_row_budget(actual: torch.Tensor, expected: torch.Tensor, *, budget: float = BF16_STAGE_ROW_BUDGET,
                     name: str = "output") -> CheckResult:
    """Every token row (the last dim is the row's width) has ||a - e|| <= budget · ||e||; the worst row is named
    with its error. NaN/Inf fail. Spec: upstream_checks AP-14."""
    check, spec = "check_row_budget", "AP-14"
    problem = _pair_problem(check, spec, name, actual, expected)
    if problem is not None:
        return problem
    a = actual.detach().cpu().to(torch.float64).reshape(-1, actual.shape[-1])
    e = expected.detach().cpu().to(torch.float64).reshape(-1, actual.shape[-1])
    err = (a - e).norm(dim=1).nan_to_num(nan=math.inf)
    allowed = budget * e.norm(dim=1)
    ratio = torch.where(allowed > 0, err / allowed.clamp_min(1e-300), torch.where(err > 0, math.inf, 0.0))
    bad = (ratio > 1) | ~torch.isfinite(a).all(dim=1) | ~torch.isfinite(e).all(dim=1)
    if not bool(bad.any()):
        return passed(check, spec, a.shape[0])
    row = int(torch.where(bad, ratio.nan_to_num(nan=math.inf), -1.0).argmax())
    rel = float(err[row] / e[row].norm()) if float(e[row].norm()) > 0 else math.inf
    return failed(check, spec, a.shape[0], int(bad.sum()),
                  Violation(f"{name} row", _row_index(row, tuple(actual.shape[:-1])), rel, f"<= {budget:g}",
                            budget, note="relative L2 error of the token row"))


def check_bf16_stage(actual: torch.Tensor, expected: torch.Tensor, *, name: str = "output") -> CheckResult:
    """A BF16-ending stage: ratio_allclose(1e-4, 1/128) and then every token row within 2^-8 relative L2.
    Spec: upstream_checks AP-14."""
    atol, rtol = BF16_STAGE_TOL
    first = check_ratio_allclose(actual, expected, atol=atol, rtol=rtol, name=name)
    return first if not first.ok else check_row_budget(actual, expected, name=name)


# The resident CED metrics: relative L2 <= 0.02 over the output, worst token row relative L2 <= 0.05, finite.
# upstream_checks AP-15.
CED_REL_L2 = 0.02
CED_WORST_ROW_L2 = 0.05


def check_ced_metrics(actual: torch.Tensor, expected: torch.Tensor, *, name: str = "output") -> CheckResult:
    """One resident-CED output (a stream, the final norm, logits or a cache): finite, global relative L2 <=
    0.02, and the worst token row's relative L2 <= 0.05. Spec: upstream_checks AP-15."""
    check, spec = "check_ced_metrics", "AP-15"
    problem = _pair_problem(check, spec, name, actual, expected)
    if problem is not None:
        return problem
    a = actual.detach().cpu().to(torch.float64)
    e = expected.detach().cpu().to(torch.float64)
    if not bool(torch.isfinite(a).all()):
        idx = tuple(int(i) for i in (~torch.isfinite(a)).nonzero()[0])
        return failed(check, spec, a.numel(), int((~torch.isfinite(a)).sum()),
                      Violation(name, idx, float(a[idx]), "finite"))
    global_rel = float((a - e).norm() / e.norm()) if float(e.norm()) > 0 else float((a - e).norm() > 0) * math.inf
    if global_rel > CED_REL_L2:
        return failed(check, spec, 1, 1, Violation(name, (), global_rel, f"<= {CED_REL_L2}", CED_REL_L2,
                                                    note="global relative L2"))
    worst_row = check_row_budget(actual, expected, budget=CED_WORST_ROW_L2, name=name)
    return dataclasses.replace(worst_row, check=check, spec=spec)


@operator(returns='CheckResult', spec='§6')
def check_active_split(actual: torch.Tensor, expected: torch.Tensor, num_tokens: int, *,
                       leaf: Leaf = check_row_precision, name: str = "output") -> CheckResult:
    """Compare active rows ``[:num_tokens]`` and the inactive suffix separately with ``leaf``.

    Padding can therefore neither dilute nor inflate the active error. ``actual`` [T, ...]. Spec: §6
    (`make_compare_attention_hidden`).
    """
    check, spec = "check_active_split", "§6"
    if tuple(actual.shape) != tuple(expected.shape) or actual.ndim == 0:
        return failed(check, spec, 1, 1, Violation(f"{name}.shape", (), tuple(actual.shape), tuple(expected.shape)))
    total = actual.shape[0]
    if not 0 <= num_tokens <= total:
        return failed(check, spec, 1, 1, Violation("num_tokens", (), num_tokens, f"in [0, {total}]"))
    results = []
    if num_tokens > 0:
        results.append(leaf(actual[:num_tokens], expected[:num_tokens], name=f"{name}[active rows]"))
    if num_tokens < total:
        results.append(leaf(actual[num_tokens:], expected[num_tokens:], name=f"{name}[inactive suffix from {num_tokens}]"))
    return first_failure(results)


@operator(returns='CheckResult (a pass counts every owned and padding row)', spec='§6/§7.1')
def check_owner_rows(actual_slabs: Sequence[torch.Tensor], expected: torch.Tensor,
                     bounds: Sequence[tuple[int, int, int]], *, leaf: Leaf = check_row_precision,
                     require_zero_padding: bool = True, name: str = "output") -> CheckResult:
    """Per rank, compare its owned rows (``first, count, width``) with ``leaf``; padding rows must be 0.

    ``actual_slabs[r]`` [width, D]; ``expected`` [T_active, D]. Ranks with count 0 have only padding.
    Spec: §6 (`compare_owner_rows(require_zero_padding=True)`), §7.1.
    """
    check, spec = "check_owner_rows", "§6/§7.1"
    if len(actual_slabs) != len(bounds):
        return failed(check, spec, 1, 1, Violation(f"{name}.ranks", (), len(actual_slabs), len(bounds)))
    results = []
    for rank, (slab, (first, count, width)) in enumerate(zip(actual_slabs, bounds, strict=True)):
        if slab.shape[0] != width:
            return failed(check, spec, 1, 1, Violation(f"{name}.rank{rank}.rows", (), slab.shape[0], width))
        if count:
            results.append(leaf(slab[:count], expected[first:first + count], name=f"{name}.rank{rank}"))
        if require_zero_padding and count < width:
            pad = slab[count:].detach().cpu().to(torch.float64).reshape(width - count, -1)
            nz = (pad != 0) | ~torch.isfinite(pad)
            if bool(nz.any()):
                row, col = (int(v) for v in nz.nonzero()[0])
                results.append(failed(check, spec, width - count, int(nz.any(1).sum()),
                                      Violation(f"{name}.rank{rank} padding row", (count + row, col),
                                                float(pad[row, col]), 0.0,
                                                note="inactive rows must be exactly zero")))
            else:
                results.append(passed(check, spec, width - count))
    bad = next((r for r in results if not r.ok), None)
    return bad if bad is not None else passed(check, spec, sum(r.n_checked for r in results))


@operator(returns='CheckResult', spec='§6')
def check_replicas_identical(replicas: Sequence[torch.Tensor], *, name: str = "output") -> CheckResult:
    """Every TP replica is byte-identical to replica 0. Spec: §6 (`compare_reduced`)."""
    check, spec = "check_replicas_identical", "§6"
    if not replicas:
        return failed(check, spec, 1, 1, Violation(f"{name}.replicas", (), 0, ">= 1"))
    ref = replicas[0]
    ref_bytes = byte_view(ref)
    for rank, rep in enumerate(replicas[1:], start=1):
        if rep.dtype != ref.dtype or tuple(rep.shape) != tuple(ref.shape):
            return failed(check, spec, len(replicas), 1,
                          Violation(f"{name}.replica{rank}", (), f"{rep.dtype}{list(rep.shape)}",
                                    f"{ref.dtype}{list(ref.shape)}"))
        rep_bytes = byte_view(rep)
        diff = rep_bytes != ref_bytes
        if bool(diff.any()):
            byte = int(diff.nonzero()[0, 0])
            elem = byte // ref.element_size()
            idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(elem), ref.shape)) if ref.ndim else ()
            return failed(check, spec, len(replicas), int((rep != ref).sum()) or 1,
                          Violation(f"{name}.replica{rank}", idx, rep.reshape(-1)[elem].item(),
                                    ref.reshape(-1)[elem].item(), note="replica bytes differ from replica 0"))
    return passed(check, spec, len(replicas))


# The leaf rules a contract selects by name (``comparator(name)``): every upstream variant of the output bound.
# (The tree comparators, which take a whole case context, are ``contracts.compare.COMPARATORS``.)
LEAF_RULES: dict[str, Leaf] = {
    "row_rms_peak": check_row_precision,  # current rule (§6 prefill C1A)
    "fp8_budget": check_output_budget,  # decode SWA / C2A
    "ratio_allclose_c1a_decode": lambda a, e, **kw: check_ratio_allclose(
        a, e, atol=1e-2, rtol=1e-2, max_error_ratio=0.01, **kw),  # older decode C1A rule
    "prefill_swa_mhc": lambda a, e, *, valid_rows, **kw: check_ratio_allclose(
        a, e, atol=1e-2, rtol=1e-2, max_error_ratio=0.01, valid_rows=valid_rows, zero_tail=True, **kw),  # AP-13
    "bf16_stage": check_bf16_stage,  # AP-14
    "ced_metrics": check_ced_metrics,  # AP-15
}


def comparator(name: str) -> Leaf:
    """Look a comparator up by name (every upstream variant stays selectable)."""
    try:
        return LEAF_RULES[name]
    except KeyError:
        raise ValueError(f"comparator: expected one of {sorted(LEAF_RULES)}, got {name!r}") from None


def check_logits(actual: torch.Tensor, expected: torch.Tensor, *, tp: int = 1, name: str = "logits") -> CheckResult:
    """Every logit within 1e-3 + 1e-3·|e| (no quota); the worst element is named with its vocabulary shard and
    the shard's own column when ``tp`` > 1. Spec: AP-17."""
    check, spec = "check_logits", "AP-17"
    problem = _pair_problem(check, spec, name, actual, expected)
    if problem is not None:
        return problem
    a, e = actual.to(torch.float64), expected.to(torch.float64)
    atol, rtol = LOGITS_TOL
    allowed = atol + rtol * e.abs()
    excess = ((a - e).abs() - allowed).nan_to_num(nan=math.inf)
    bad = (excess > 0) | ~torch.isfinite(a) | ~torch.isfinite(e)
    if not bool(bad.any()):
        return passed(check, spec, a.numel())
    t, v = (int(i) for i in torch.unravel_index(torch.where(bad, excess, -math.inf).argmax(), a.shape))
    per = a.shape[1] // tp
    return failed(check, spec, a.numel(), int(bad.sum()),
                  Violation(f"{name} row", (t, v), float(a[t, v]), float(e[t, v]), float(allowed[t, v]),
                            note=f"vocab shard {v // per} column {v % per}" if tp > 1 else ""))


def check_greedy(ids: torch.Tensor, logits: torch.Tensor, *, name: str = "ids") -> CheckResult:
    """Greedy ids equal the first maximum of the logits being judged (the device's own, not the golden's):
    self-consistency, ties to the lowest id. Spec: AP-18."""
    check, spec = "check_greedy", "AP-18"
    if ids.shape != logits.shape[:1] or ids.dtype != torch.int32:
        return failed(check, spec, 1, 1, Violation(f"{name}.layout", (), f"{ids.dtype}{list(ids.shape)}",
                                                   f"int32[{logits.shape[0]}]"))
    best = logits.max(dim=1, keepdim=True).values
    first = (logits == best).to(torch.int8).argmax(dim=1).to(torch.int32)
    wrong = ids != first
    if bool(wrong.any()):
        t = int(wrong.nonzero()[0, 0])
        return failed(check, spec, ids.numel(), int(wrong.sum()),
                      Violation(f"{name} row", (t,), int(ids[t]), int(first[t]),
                                note=f"the first maximum of row {t} (value {float(best[t, 0]):.6g})"))
    return passed(check, spec, ids.numel())


def check_mxfp8_activation(payload: torch.Tensor, scale: torch.Tensor, expected_payload: torch.Tensor,
                           expected_scale: torch.Tensor, *, group: int = 32,
                           name: str = "activation") -> CheckResult:
    """MXFP8 payloads [..., K] (float8_e4m3fn) with E8M0 scale codes [..., K/group] (uint8) compared by their
    decoded values: |a - e| <= 2e-3 + 2e-3·|e| on every element, no quota; code 255 (NaN) or a non-finite value
    fails. Spec: upstream_checks CQ-25."""
    check, spec = "check_mxfp8_activation", "CQ-25"
    for what, p, s in (("actual", payload, scale), ("expected", expected_payload, expected_scale)):
        if p.dtype != torch.float8_e4m3fn or s.dtype != torch.uint8 or p.shape[-1] != s.shape[-1] * group or \
                p.shape[:-1] != s.shape[:-1]:
            return failed(check, spec, 1, 1, Violation(f"{name}.{what} layout", (), f"{p.dtype}{list(p.shape)} / "
                                                       f"{s.dtype}{list(s.shape)}", f"float8_e4m3fn [..., K] with "
                                                       f"uint8 E8M0 codes [..., K/{group}]"))
    if payload.shape != expected_payload.shape:
        return failed(check, spec, 1, 1, Violation(f"{name}.shape", (), list(payload.shape),
                                                   list(expected_payload.shape)))

    def decode(p: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        factor = torch.where(s == 255, math.nan, torch.exp2(s.to(torch.float64) - 127))
        return (p.to(torch.float64).unflatten(-1, (-1, group)) * factor[..., None]).flatten(-2)

    atol, rtol = MXFP8_ACTIVATION_TOL
    a, e = decode(payload, scale), decode(expected_payload, expected_scale)
    allowed = atol + rtol * e.abs()
    excess = ((a - e).abs() - allowed).nan_to_num(nan=math.inf)
    bad = excess > 0
    if not bool(bad.any()):
        return passed(check, spec, a.numel())
    idx = tuple(int(i) for i in torch.unravel_index(excess.flatten().argmax(), a.shape))
    return failed(check, spec, a.numel(), int(bad.sum()),
                  Violation(name, idx, float(a[idx]), float(e[idx]), float(allowed[idx]),
                            note=f"decoded values; scale codes {int(scale[idx[:-1] + (idx[-1] // group,)])} vs "
                                 f"{int(expected_scale[idx[:-1] + (idx[-1] // group,)])}"))


def _tol(pair: tuple[float, float]) -> dict[str, float]:
    return {"atol": pair[0], "rtol": pair[1]}


BOUNDS = (
    Bound("exact", "byte identity"),
    Bound("gate_codes", "byte identity on the rows of the real rows' 16-row M-tiles (upstream's gate_active_rows)"),
    Bound("cache_scale", "byte identity, published rows and untouched rows alike"),
    Bound("greedy", "the first maximum of the backend's own logits, exactly"),
    Bound("fp32_ulps", "|a - e| <= ulps x the ulp of the row's largest |e|; non-finite values identical",
          {"ulps": FP32_ULPS}),
    Bound("row_rms_peak", "per row: RMS and peak of |a - e| within atol + rtol x the row's own",
          dict(dataclasses.asdict(ROW_BOUND))),
    Bound("masked_scores", "the -inf mask exact; finite scores by the row rule",
          {"rms_rtol": ROW_BOUND.rms_rtol, "peak_rtol": ROW_BOUND.peak_rtol}),
    Bound("fp8_budget", "global and per-row relative L2, and the cosine", dict(dataclasses.asdict(FP8_BUDGET))),
    Bound("attention_forced", "the attention re-run on the backend's own input, by the FP8 output budget",
          dict(dataclasses.asdict(FP8_BUDGET))),
    Bound("hc_mix", "ratio_allclose on the active rows; padding rows exactly +0.0", {**_tol(HC_MIX_TOL), "padding": 0.0}),
    Bound("hc_out", "ratio_allclose", _tol(HC_OUT_TOL)),
    Bound("ffn_input", "ratio_allclose against the collapse of the backend's own attention output", _tol(HC_OUT_TOL)),
    Bound("bf16_stage", "ratio_allclose, then every row within a relative L2 budget",
          {**_tol(BF16_STAGE_TOL), "row_rel_l2": BF16_STAGE_ROW_BUDGET}),
    Bound("engram", "ratio_allclose; a stack of TP ranks identical on every rank", _tol(ENGRAM_TOL)),
    Bound("logits", "every element within atol + rtol x |e|, no quota", {**_tol(LOGITS_TOL), "quota": 0.0}),
    Bound("qr_scale", "ratio_allclose, no quota", _tol(QR_SCALE_TOL)),
    Bound("attn_out_v4", "ratio_allclose with a quota (at Pro geometry around the INT8 latent-code slack)",
          {**_tol(V4_ATTN_OUT_TOL), "quota": V4_ATTN_OUT_QUOTA}),
    Bound("v4_cmp_pool", "written rows by ratio_allclose (no quota), every other row byte for byte",
          _tol(V4_CMP_POOL_TOL)),
    Bound("v4_state_pool", "written rows by ratio_allclose (no quota), every other row byte for byte",
          _tol(V4_STATE_POOL_TOL)),
    Bound("v4_prefill_mtp_out", "active rows by ratio_reldiff, padding rows exactly 0",
          {"diff_thd": V4_PREFILL_MTP_RELDIFF[0], "pct_thd": V4_PREFILL_MTP_RELDIFF[1]}),
    Bound("v4_kv_pool", "written rows by ratio_reldiff, every other row byte for byte",
          {"diff_thd": V4_KV_POOL_RELDIFF[0], "pct_thd": V4_KV_POOL_RELDIFF[1]}),
    Bound("v4_cp_x_out", "query rows by ratio_reldiff with a max_diff, rows without a query exactly 0",
          {"diff_thd": V4_CP_X_OUT_RELDIFF[0], "pct_thd": V4_CP_X_OUT_RELDIFF[1],
           "max_diff": V4_CP_X_OUT_RELDIFF[2]}),
    Bound("v4_cp_kv_cache", "written rows by ratio_allclose with a quota, every other row byte for byte",
          {**_tol(V4_CP_KV_TOL), "quota": V4_CP_KV_QUOTA}),
    Bound("dspark_x_out", "ratio_allclose with a quota", {**_tol(DSPARK_X_OUT_TOL), "quota": DSPARK_X_OUT_QUOTA}),
)


def rows_outside_stage_bound(actual: torch.Tensor, expected: torch.Tensor,
                             terms: torch.Tensor | None = None) -> torch.Tensor:
    """[rows] bool: the rows of ``actual`` with an element outside the stage bound (BF16_STAGE_TOL) of ``expected``:
    |a - e| <= atol + rtol · (|e| + terms), ``terms`` the magnitude of the summands that make the element (e.g.
    post · attn_out beside x_out, where the residual term may cancel them; none: |e| alone). A NaN or an infinity
    on either side is outside (the comparison is written so that it cannot pass). A row is every leading index."""
    from contracts.tolerances import BF16_STAGE_TOL

    atol, rtol = BF16_STAGE_TOL
    a, e = actual.double(), expected.double()
    scale = e.abs() if terms is None else e.abs() + terms.double()
    within = (a - e).abs() <= atol + rtol * scale
    return (~within).reshape(actual.shape[0], -1).any(1)
