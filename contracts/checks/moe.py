"""Comparators of the MoE FFN: the router's ids and weights, and the combined output per EP rank.

* ``check_gate_ids`` (MO-03): every id in [0, E), no duplicate in a row; the selected set (order ignored) equals
  the reference's, or -- rule ``score-bounds``, the default -- differs only where the biased scores cannot
  order the experts: a mismatch fails when an expert the reference selected and the backend omitted has a
  lower bound (s - err) above the upper bound (s + err) of an expert the backend selected instead, err =
  atol + rtol·|s| on the reference's biased scores. Rule ``strict`` (upstream's gate_indices_compare) fails
  on any set mismatch.
* ``check_gate_weights`` (MO-04): finite, > 0, each row summing to the routed scaling factor within 2e-5, and
  equal to the reference's unbiased scores at the backend's own ids, normalised and scaled, within
  2e-4 + 5e-5·|w| + 2e-4 (score tolerance propagated, plus the normalisation's).
* ``check_moe_rows`` (MO-05, MO-06): rows >= the rank's token count bitwise equal to the reference (zeros);
  the active prefix within ratio_reldiff (|Δ| / |e| > 3e-3 for at most 2 % of elements) and worst |Δ| <= 0.25.

Spec: §1; upstream_checks MO-03, MO-04, MO-05, MO-06.
"""

from __future__ import annotations

import dataclasses

import torch

from contracts.result import Bound, CheckResult, Tally, Violation, failed, passed
from contracts.tolerances import (
    MAX_ABS,
    NORMALISATION_ATOL,
    RELDIFF_PCT,
    RELDIFF_THD,
    SCORE_ATOL,
    SCORE_RTOL,
    WEIGHT_SUM_TOL,
)

GATE_ID_RULES = ("score-bounds", "strict")


def check_gate_ids(actual: torch.Tensor, expected: torch.Tensor, biased_scores: torch.Tensor, *,
                   n_experts: int, rule: str = "score-bounds", atol: float = SCORE_ATOL, rtol: float = SCORE_RTOL,
                   name: str = "ids") -> CheckResult:
    """[T, k] INT32 ids against the reference's ids and biased scores [T, E]. Spec: MO-03."""
    if rule not in GATE_ID_RULES:
        raise ValueError(f"rule: expected one of {GATE_ID_RULES}, got {rule!r}")
    if actual.shape != expected.shape or actual.dtype != torch.int32:
        return failed("check_gate_ids", "MO-03", 1, 1, Violation(f"{name}.layout", (), f"{actual.dtype}"
                                                                 f"{list(actual.shape)}", f"int32{list(expected.shape)}"))
    tally = Tally("check_gate_ids", "MO-03")
    for t in range(actual.shape[0]):
        row = [int(v) for v in actual[t]]
        bad = [v for v in row if not 0 <= v < n_experts]
        if bad:
            tally.fail(Violation(f"{name} row", (t,), bad[0], f"an expert id in [0, {n_experts})"))
            continue
        if len(set(row)) != len(row):
            tally.fail(Violation(f"{name} row", (t,), row, "no expert twice"))
            continue
        got, want = set(row), {int(v) for v in expected[t]}
        tally.n_checked += 1
        if got == want:
            continue
        if rule == "strict":
            tally.fail(Violation(f"{name} row", (t,), sorted(got), sorted(want), note="set mismatch (strict rule)"))
            continue
        s = biased_scores[t].double()
        err = atol + rtol * s.abs()
        omitted, extra = sorted(want - got), sorted(got - want)
        lo = max(omitted, key=lambda e: float(s[e] - err[e]))
        hi = min(extra, key=lambda e: float(s[e] + err[e]))
        if float(s[lo] - err[lo]) > float(s[hi] + err[hi]):
            tally.fail(Violation(f"{name} row", (t,), sorted(got), sorted(want),
                                 note=f"expert {lo} (score {float(s[lo]):.6g}) omitted for expert {hi} (score "
                                      f"{float(s[hi]):.6g}): the scores order them beyond atol={atol:g}, "
                                      f"rtol={rtol:g}"))
    return tally.result()


def check_gate_weights(actual: torch.Tensor, ids: torch.Tensor, scores: torch.Tensor, *, scale: float,
                       name: str = "weights") -> CheckResult:
    """[T, k] FP32 weights of the backend's ``ids`` against the reference's unbiased scores [T, E]. Spec: MO-04."""
    check, spec = "check_gate_weights", "MO-04"
    if actual.shape != ids.shape or actual.dtype != torch.float32:
        return failed(check, spec, 1, 1, Violation(f"{name}.layout", (), f"{actual.dtype}{list(actual.shape)}",
                                                   f"float32{list(ids.shape)}"))
    a = actual.double()
    bad = ~torch.isfinite(a) | (a <= 0)
    if bool(bad.any()):
        t, k = (int(v) for v in bad.nonzero()[0])
        return failed(check, spec, a.numel(), int(bad.sum()), Violation(name, (t, k), float(a[t, k]),
                                                                        "finite and > 0"))
    sums = a.sum(1)
    off = (sums - scale).abs() > WEIGHT_SUM_TOL
    if bool(off.any()):
        t = int(off.nonzero()[0, 0])
        return failed(check, spec, a.shape[0], int(off.sum()), Violation(f"{name} row sum", (t,), float(sums[t]),
                                                                         scale, WEIGHT_SUM_TOL))
    chosen = scores.double().gather(1, ids.clamp(0, scores.shape[1] - 1).long())
    want = chosen / (chosen.sum(1, keepdim=True) + 1e-20) * scale
    allowed = SCORE_ATOL + SCORE_RTOL * want.abs() + NORMALISATION_ATOL
    over = (a - want).abs() > allowed
    if bool(over.any()):
        t, k = (int(v) for v in over.nonzero()[0])
        return failed(check, spec, a.numel(), int(over.sum()), Violation(name, (t, k), float(a[t, k]),
                                                                         float(want[t, k]), float(allowed[t, k])))
    return passed(check, spec, a.numel())


def check_moe_rows(actual: torch.Tensor, expected: torch.Tensor, num_tokens: int, *, name: str = "output"
                   ) -> CheckResult:
    """One EP rank's combined output [T, D]: padding rows bitwise, the active prefix by ratio_reldiff and the
    worst |Δ|. Spec: MO-05, MO-06."""
    check, spec = "check_moe_rows", "MO-06"
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return failed(check, spec, 1, 1, Violation(f"{name}.layout", (), f"{actual.dtype}{list(actual.shape)}",
                                                   f"{expected.dtype}{list(expected.shape)}"))
    pa, pe = actual[num_tokens:].flatten(1), expected[num_tokens:].flatten(1)
    differ = (pa.view(torch.int16) != pe.view(torch.int16)) if actual.dtype == torch.bfloat16 else (pa != pe)
    if bool(differ.any()):
        r, c = (int(v) for v in differ.nonzero()[0])
        return failed(check, "MO-05", pa.numel(), int(differ.sum()),
                      Violation(f"{name} padding row", (num_tokens + r, c), float(pa[r, c]), float(pe[r, c])))
    a, e = actual[:num_tokens].double(), expected[:num_tokens].double()
    if a.numel() == 0:
        return passed(check, spec, 0)
    if not bool(torch.isfinite(a).all()):
        idx = tuple(int(v) for v in (~torch.isfinite(a)).nonzero()[0])
        return failed(check, spec, a.numel(), int((~torch.isfinite(a)).sum()), Violation(name, idx, float(a[idx]),
                                                                                         float(e[idx])))
    diff = (a - e).abs()
    worst = tuple(int(v) for v in torch.unravel_index(diff.argmax(), diff.shape))
    if float(diff[worst]) > MAX_ABS:
        return failed(check, spec, a.numel(), int((diff > MAX_ABS).sum()),
                      Violation(name, worst, float(a[worst]), float(e[worst]), MAX_ABS, note="worst |Δ|"))
    rel = diff / e.abs().clamp_min(1e-12)
    over = rel > RELDIFF_THD
    if int(over.sum()) > RELDIFF_PCT * a.numel():  # the worst element over the threshold, not the first
        idx = tuple(int(v) for v in torch.unravel_index(torch.where(over, rel, -1.0).argmax(), rel.shape))
        return failed(check, spec, a.numel(), int(over.sum()),
                      Violation(name, idx, float(a[idx]), float(e[idx]), RELDIFF_THD,
                                note=f"{int(over.sum())}/{a.numel()} elements over relative diff {RELDIFF_THD:g} "
                                     f"(quota {RELDIFF_PCT:.0%}); the worst shown"))
    return passed(check, spec, a.numel())


def check_recv_y(actual: torch.Tensor, expected: torch.Tensor, counts: torch.Tensor,
                 expected_counts: torch.Tensor, *, recv_max: int, name: str = "recv_y") -> CheckResult:
    """One destination's routed-expert outputs [n_local, recv_max, D] with ``counts`` [n_local]: each count
    equals the expected one and lies in [0, recv_max]; every slot past a count is exactly zero; the used slots
    are finite and within the MO-06 ratio_reldiff / worst |Δ| budget. Spec: upstream_checks MO-05."""
    check, spec = "check_recv_y", "MO-05"
    if actual.shape != expected.shape or counts.shape != expected_counts.shape or actual.ndim != 3:
        return failed(check, spec, 1, 1, Violation(f"{name}.layout", (), f"{list(actual.shape)} / {list(counts.shape)}",
                                                   f"{list(expected.shape)} / {list(expected_counts.shape)}"))
    for local, (c, want) in enumerate(zip(counts.tolist(), expected_counts.tolist(), strict=True)):
        if not 0 <= c <= recv_max or c != want:
            return failed(check, spec, counts.numel(), 1,
                          Violation(f"{name}.recv_expert_count", (local,), c, want, f"[0, {recv_max}]"))
    results = []
    for local, c in enumerate(counts.tolist()):
        results.append(check_moe_rows(actual[local], expected[local], c, name=f"{name}.expert{local}"))
    bad = [r for r in results if not r.ok]
    if bad:
        return dataclasses.replace(bad[0], check=check, spec=spec)
    return passed(check, spec, int(counts.sum()))


def check_ffn_owned(owned: torch.Tensor, forced: torch.Tensor, owners: torch.Tensor, tokens: int, *,
                    group_base: int = 0, name: str = "ffn_owned") -> CheckResult:
    """A TP group's owned MoE rows [tp, T, D] against the MoE re-run on the same input (teacher-forced) [T, D]:
    every card's owned active rows within ratio_reldiff(3e-3, 2 %) and worst |Δ| (the MO-06 budget), every row
    it does not own exactly zero, all finite. Spec: upstream_checks MO-11."""
    check, spec = "check_ffn_owned", "MO-11"
    if owned.ndim != 3 or tuple(owned.shape[1:]) != tuple(forced.shape):
        return failed(check, spec, 1, 1, Violation(f"{name}.layout", (), list(owned.shape), f"[tp, {list(forced.shape)}]"))
    for card in range(owned.shape[0]):
        mine = owners[:tokens].to(torch.int64) == group_base + card
        others = owned[card, :tokens][~mine]
        dirty = (others != 0).any(-1) if others.numel() else torch.zeros(0, dtype=torch.bool)
        if bool(dirty.any()):
            row = int((~mine).nonzero()[int(dirty.nonzero()[0, 0]), 0])
            return failed(check, spec, int((~mine).sum()), int(dirty.sum()),
                          Violation(f"{name} card {group_base + card} row", (row,), "written", "zero",
                                    note=f"row {row} is owned by card {int(owners[row])}"))
        r = check_moe_rows(owned[card, :tokens][mine], forced[:tokens][mine], int(mine.sum()),
                           name=f"{name}.card{group_base + card}")
        if not r.ok:
            return dataclasses.replace(r, check=check, spec=spec)
    return passed(check, spec, tokens)


_ROWS = {"reldiff": RELDIFF_THD, "pct": RELDIFF_PCT, "max_abs": MAX_ABS}
BOUNDS = (
    Bound("gate_ids", "valid, unique, the reference's set unless the scores cannot order the swap",
          {"score_atol": SCORE_ATOL, "score_rtol": SCORE_RTOL}),
    Bound("gate_weights", "at the backend's own ids: the row sum, and each weight within the propagated score "
          "tolerance", {"row_sum": WEIGHT_SUM_TOL, "score_atol": SCORE_ATOL, "score_rtol": SCORE_RTOL,
                        "extra": NORMALISATION_ATOL}),
    Bound("moe_out", "padding rows bitwise; the active prefix by ratio_reldiff and the worst |difference|", _ROWS),
    Bound("recv_y", "counts exact, unused slots exactly 0, used slots by the moe_out budget",
          {**_ROWS, "padding": 0.0}),
)
