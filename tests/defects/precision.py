"""Seeded comparator defects."""

import torch

from backends import torch_backend
from contracts import tolerances
from contracts.checks import precision as p
from contracts.result import CheckResult, Violation


def _averaging_rows(actual, expected, *, bound=tolerances.ROW_BOUND, name="output"):
    """Wrong: one RMS/peak test over all rows pooled, so a bad row is diluted by good ones."""
    if actual.shape != expected.shape or actual.numel() == 0:
        return CheckResult("avg", "§6", 1, 1, Violation(name, (), actual.shape, expected.shape))
    a, e = actual.double().reshape(1, -1), expected.double().reshape(1, -1)
    return p.check_row_precision(a, e, bound=bound, name=name)


def _nan_blind(actual, expected, *, bound=tolerances.ROW_BOUND, name="output"):
    """Wrong: replaces NaN/Inf by 0 before comparing."""
    return p.check_row_precision(torch.nan_to_num(actual.double(), 0.0, 0.0, 0.0),
                                 torch.nan_to_num(expected.double(), 0.0, 0.0, 0.0), bound=bound, name=name)


def _rms_only(actual, expected, *, bound=tolerances.ROW_BOUND, name="output"):
    """Wrong: drops the peak bound."""
    return p.check_row_precision(actual, expected, bound=p.RowBound(peak_atol=1e30, peak_rtol=0.0), name=name)


def _split_pooled(actual, expected, num_tokens, *, leaf=p.check_row_precision, name="output"):
    """Wrong: compares active and inactive rows together with one leaf call."""
    return leaf(actual, expected, name=name)


def _owner_rows_ignore_padding(actual_slabs, expected, bounds, *, leaf=p.check_row_precision,
                               require_zero_padding=True, name="output"):
    """Wrong: never inspects padding rows."""
    return p.check_owner_rows(actual_slabs, expected, bounds, leaf=leaf, require_zero_padding=False, name=name)


def _replicas_allclose(replicas, *, name="output"):
    """Wrong: replicas compared with a tolerance instead of byte identity."""
    ref = replicas[0].double()
    for k, rep in enumerate(replicas[1:], 1):
        if not torch.allclose(rep.double(), ref, rtol=1e-2, atol=1e-2):
            return CheckResult("allclose", "§6", len(replicas), 1, Violation(f"{name}.replica{k}", (), "", ""))
    return CheckResult("allclose", "§6", len(replicas))


def _rms_bound_2pct(actual, expected, *, bound=tolerances.ROW_BOUND, name="output"):
    """Wrong: RMS bound loosened to 2 % of RMS(e)."""
    return p.check_row_precision(actual, expected, bound=p.RowBound(rms_rtol=0.02), name=name)


def _dtype_blind(actual, expected, *, bound=tolerances.ROW_BOUND, name="output"):
    """Wrong: upcasts both sides before checking, so dtype mismatches pass."""
    return p.check_row_precision(actual.double(), expected.double(), bound=bound, name=name)


def _budget(**kw):
    def check(actual, expected, *, budget=tolerances.FP8_BUDGET, name="output"):
        from dataclasses import replace as _replace

        return p.check_output_budget(actual, expected, budget=_replace(budget, **kw), name=name)
    return check


def _zero_rows_tolerant(actual, expected, *, budget=tolerances.FP8_BUDGET, name="output"):
    """Wrong: rows whose reference is zero may hold tiny values."""
    zero = expected.double().reshape(expected.shape[0], -1).abs().amax(1) == 0
    a = actual.clone()
    a[zero] = torch.where(a[zero].abs() < 1e-6, torch.zeros_like(a[zero]), a[zero])
    return p.check_output_budget(a, expected, budget=budget, name=name)


# registrations: each defect is the torch backend with one operator replaced
_base = torch_backend()
AVERAGING_ROWS = _base.derive("defect:averaging-rows", check_row_precision=_averaging_rows)
NAN_BLIND = _base.derive("defect:nan-blind", check_row_precision=_nan_blind)
RMS_ONLY = _base.derive("defect:rms-only", check_row_precision=_rms_only)
SPLIT_POOLED = _base.derive("defect:split-pooled", check_active_split=_split_pooled)
OWNER_ROWS_IGNORE_PADDING = _base.derive("defect:owner-rows-ignore-padding",
                                         check_owner_rows=_owner_rows_ignore_padding)
REPLICAS_ALLCLOSE = _base.derive("defect:replicas-allclose", check_replicas_identical=_replicas_allclose)
RMS_BOUND_2PCT = _base.derive("defect:rms-bound-2pct", check_row_precision=_rms_bound_2pct)
DTYPE_BLIND = _base.derive("defect:dtype-blind", check_row_precision=_dtype_blind)
ROW_BUDGET_3PCT = _base.derive("defect:row-budget-3pct", check_output_budget=_budget(row_rel_l2=0.03))
GLOBAL_BUDGET_2PCT = _base.derive("defect:global-budget-2pct", check_output_budget=_budget(global_rel_l2=0.02))
ZERO_ROWS_TOLERANT = _base.derive("defect:zero-rows-tolerant", check_output_budget=_zero_rows_tolerant)
