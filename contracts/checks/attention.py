"""The verdict on one attention half-layer call: every output it returns, each with the comparator upstream
uses for it, and messages that name the mode, phase, wiring, TP rank and row.

* ``output``: C1A modes with the per-row RMS/peak bound (the decode C1A ``ratio_allclose`` variant selectable
  by name), SWA and C2A with the FP8 budget; replicated: active rows and the inactive suffix compared
  separately on every rank, and the replicas byte-identical; sharded: each rank's owned rows, padding rows
  exactly zero.
* window cache: the quantized-cache comparator over the rows this call maps (``window_slots``), unmapped bytes
  exact. FULL: the compressed (MXFP4 g16 E4M3) and index (MXFP4 g32 E8M0) caches the same way over
  ``compressed_slots``; C2A FULL: the state ring (untouched slots exact, 0.5 % relative L2). REINDEX and REUSE:
  the compressed and index caches byte-identical to the inputs (they write neither).
* ``topk_indices``: REUSE byte-exact copies of the source's rows; C1A FULL/REINDEX the §5.3 validity rule
  against reference scores; C2A FULL the set-overlap rule. A valid selection that differs from the reference
  is accepted, and the output is then judged against the reference recomputed for that selection from the
  reference caches and original weights (``reference_for``), never from device outputs.
* ``candidate_mask`` (C1A FULL): exact.

Spec: §6, §5.3, §7.1, §7.2; upstream_checks AP-01..08, AP-11..13, SP-05, SP-09, IX-10, IX-12.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import torch

from contracts.checks import cache as cache_checks
from contracts.checks.cache import C2A_MAX_REL_L2
from contracts.checks.precision import (
    check_output_budget,
    check_owner_rows,
    check_ratio_allclose,
    check_replicas_identical,
    check_row_precision,
    comparator,
)
from contracts.checks.topk import TopKContext, check_topk_overlap, check_topk_validity
from contracts.result import Bound, CheckResult, Violation, failed, first_failure, passed
from contracts.tensors import byte_rows
from contracts.tolerances import CUTOFF_ATOL, CUTOFF_RTOL, FP8_BUDGET, GATHER_TOL, MIN_OVERLAP, ROW_BOUND
from kernels import quant
from kernels.config import LayerKind
from kernels.reference.attention_layer import FULL, REUSE
from kernels.sequence_parallel import sp_bounds

C1A = (LayerKind.C1A_FULL, LayerKind.C1A_REINDEX, LayerKind.C1A_REUSE)
CACHE_RULES = ("mode", "format")
Tensors = Mapping[str, torch.Tensor]


def output_leaf(kind: LayerKind, variant: str | None = None) -> Callable[..., CheckResult]:
    """The output comparator of a mode: ``row_rms_peak`` for C1A, ``fp8_budget`` for SWA/C2A; ``variant`` names
    another registered comparator (e.g. ``ratio_allclose_c1a_decode``)."""
    if variant is not None:
        return comparator(variant)
    return check_row_precision if LayerKind(kind) in C1A else check_output_budget


def _mapped(slots: torch.Tensor, rows: int) -> torch.Tensor:
    m = torch.zeros(rows, dtype=torch.bool)
    s = slots.to(torch.int64)
    m[s[s >= 0]] = True
    return m


def _decode(payload: torch.Tensor, scale: torch.Tensor, rule: str) -> torch.Tensor:
    rows = payload.shape[0] * payload.shape[1]
    return quant.mx_dequantize(quant.MXTensor(payload.reshape(rows, -1), scale.reshape(rows, -1), rule))


def _cache(where: str, name: str, actual: Tensors, expected: Tensors, slots: torch.Tensor, rule: str,
           max_rel_l2: float | None = None) -> CheckResult:
    a, e = (actual[f"{name}_payload"], actual[f"{name}_scale"]), (expected[f"{name}_payload"], expected[f"{name}_scale"])
    for got, want, field in ((a[0], e[0], "payload"), (a[1], e[1], "scale")):
        if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
            return failed("check_quantized_cache", "§6", 1, 1,
                          Violation(f"{where}: {name}_{field}.layout", (), f"{got.dtype}{list(got.shape)}",
                                    f"{want.dtype}{list(want.shape)}"))
    rows = a[0].shape[0] * a[0].shape[1]
    return cache_checks.check_quantized_cache(f"{where}: {name} cache", a, e, _mapped(slots, rows),
                                              actual_values=_decode(*a, rule), expected_values=_decode(*e, rule),
                                              fmt=quant.RULES[rule].fmt, max_rel_l2=max_rel_l2)


def _unchanged(where: str, name: str, actual: Tensors, inputs: Tensors) -> CheckResult:
    results = []
    for part in ("payload", "scale"):  # present: judge_half_layer has refused a call missing an expected output
        key = f"{name}_{part}"
        got, before = actual[key], inputs[key]
        if got.dtype != before.dtype or tuple(got.shape) != tuple(before.shape):
            results.append(failed("check_unchanged", "§2.3", 1, 1, Violation(
                f"{where}: {key}.layout", (), f"{got.dtype}{list(got.shape)}", f"{before.dtype}{list(before.shape)}")))
            continue
        rows = got.shape[0] * got.shape[1]
        r = cache_checks.check_bytes_outside(f"{where}: {key} (this mode writes no {name} cache)",
                                             got.reshape(rows, -1), before.reshape(rows, -1),
                                             torch.zeros(rows, dtype=torch.bool))
        results.append(r)
    return first_failure(results)


def check_layer_output(where: str, actual: torch.Tensor, expected: torch.Tensor, *, wiring: str, tp: int, active: int,
                       tokens: int, leaf) -> CheckResult:
    """The output of one call: replicated, every rank's active rows and inactive suffix separately and the
    replicas byte-identical; sharded, every rank's owned rows with ``leaf`` and padding rows exactly zero."""
    if actual.dtype != expected.dtype or tuple(actual.shape) != tuple(expected.shape):
        return failed("check_output", "§6", 1, 1, Violation(f"{where}: output.layout", (),
                                                             f"{actual.dtype}{list(actual.shape)}",
                                                             f"{expected.dtype}{list(expected.shape)}"))
    results = []
    if wiring == "replicated":
        for rank in range(tp):
            results.append(leaf(actual[rank, :active], expected[rank, :active],
                                name=f"{where}: output.rank{rank}[active rows]"))
            if active < tokens:  # rows the entry never writes keep the caller's bytes (the 13.0 sentinel)
                results.append(_exact(f"{where}: output.rank{rank} inactive row", actual[rank, active:],
                                      expected[rank, active:], offset=active))
        results.append(check_replicas_identical(list(actual), name=f"{where}: output"))
    else:
        bounds = sp_bounds(active, tp, tokens)
        want = torch.cat([expected[r, :b.count] for r, b in enumerate(bounds)])
        results.append(check_owner_rows(list(actual), want, [(b.first, b.count, b.width) for b in bounds], leaf=leaf,
                                        require_zero_padding=True, name=f"{where}: output"))
    return first_failure(results)


def active_rows_from_golden(expected: torch.Tensor) -> int:
    """The active token count an ownership-padded sharded golden ``[ranks, width, ...]`` names: each rank's owned
    rows lead its slab and its padding rows are exactly zero, so the last non-zero row of the last rank holding
    one ends the batch (``rank * width + row + 1``); 0 when every row is zero. Spec: SP-04."""
    if expected.dim() < 2:
        raise ValueError(f"an ownership-padded golden is [ranks, width, ...], got shape {list(expected.shape)}")
    ranks, width = int(expected.shape[0]), int(expected.shape[1])
    rows = expected.detach().reshape(ranks, width, -1)
    live = (rows != 0).any(-1) if rows.shape[-1] else torch.zeros(ranks, width, dtype=torch.bool)
    active = 0
    for rank in range(ranks):
        hit = live[rank].nonzero()
        if hit.numel():
            active = rank * width + int(hit[-1, 0]) + 1
    return active


def owner_active_rows(golden: torch.Tensor | None, *, active: int | None = None,
                      inputs: Mapping[str, torch.Tensor] | None = None) -> tuple[int, str]:
    """(the batch's active token count, where it came from) for an owner-row comparison: the caller's
    ``active`` when given, else the inputs' ``num_tokens``, else read from the ownership-padded ``golden``
    (:func:`active_rows_from_golden`) -- never the slab capacity, which overstates ownership whenever the last
    slab ends partly filled. ``golden=None`` (a replicated output keeps the caller's bytes past the batch, so it
    names no count) makes a missing ``num_tokens`` a ``KeyError``. Spec: SP-04."""
    if active is not None:
        return int(active), "explicit"
    if inputs is not None and "num_tokens" in inputs:
        return int(inputs["num_tokens"]), "num_tokens"
    if golden is None:
        raise KeyError("num_tokens: the inputs name no active count and a replicated golden cannot name one")
    return active_rows_from_golden(golden), "golden"


def judge_half_layer(actual: Tensors, expected: Tensors, inputs: Tensors, *, kind: LayerKind | str, phase: str,
                     wiring: str, tp: int, block_size: int, variant: str | None = None,
                     scores: torch.Tensor | Callable[[], torch.Tensor] | None = None,
                     reference_for: Callable[[torch.Tensor], Tensors] | None = None,
                     only: str | None = None, cache_rule: str = "mode", active: int | None = None) -> CheckResult:
    """Judge every output of one half-layer call (see module doc); ``only`` names one output and returns its
    verdict alone (the golden replay's per-output table). ``scores``: the reference index scores, or a callable
    computing them (needed when a C1A FULL/REINDEX selection differs from the reference);
    ``reference_for(selection)``: the reference outputs recomputed for an accepted alternative selection;
    ``cache_rule``: ``"mode"`` (decode C2A ``compare_cache``: 1 % for C2A FULL's MXFP4 caches) or ``"format"``
    (``quantized_cache_compare``: MXFP8 1 %, MXFP4 4 % for every mode); ``active``: the batch's active token
    count when the caller knows it, else the inputs' ``num_tokens``, else (sharded) read from the golden output
    (:func:`owner_active_rows`, SP-04). Spec: §6, §5.3."""
    if cache_rule not in CACHE_RULES:
        raise ValueError(f"cache_rule: expected one of {CACHE_RULES}, got {cache_rule!r}")
    kind = LayerKind(kind)
    where = f"{kind.value} {phase} {wiring} TP{tp}"
    results: list[tuple[tuple[str, ...], CheckResult]] = []
    missing = sorted(set(expected) - set(actual))
    if missing:
        results.append((tuple(missing), failed("judge_half_layer", "§6", len(expected), len(missing),
                                               Violation(f"{where}: outputs", (), f"missing {missing}",
                                                         sorted(expected)))))
    extra = sorted(set(actual) - set(expected))
    if extra:
        results.append((tuple(extra), failed("judge_half_layer", "§2.3", len(actual), len(extra), Violation(
            f"{where}: outputs", (), f"unexpected {extra}", sorted(expected),
            note="a mode returns only the caches it owns"))))
    if missing:
        return _pick(results, only)
    try:
        active, _source = owner_active_rows(expected["output"] if wiring == "sharded" else None, active=active,
                                            inputs=inputs)
    except KeyError as e:
        return failed("judge_half_layer", "SP-04", 1, 1, Violation(f"{where}: active count", (), "absent",
                                                                   "num_tokens in the inputs", note=str(e)))
    tokens = int(inputs["position_ids"].shape[0])
    want = expected
    if "topk_indices" in expected:
        verdict, want = _selection(where, kind, actual, expected, inputs, active, block_size, scores, reference_for)
        results.append((("topk_indices",), verdict))
    results.append((("output",), check_layer_output(where, actual["output"], want["output"], wiring=wiring, tp=tp,
                                                    active=active, tokens=tokens, leaf=output_leaf(kind, variant))))
    results.append((("window_payload", "window_scale"),
                    _cache(where, "window", actual, want, inputs["window_slots"][:active], "window")))
    if kind in FULL:
        slots = inputs["compressed_slots"][:active]
        budget = C2A_MAX_REL_L2 if kind is LayerKind.C2A_FULL and cache_rule == "mode" else None
        results.append((("compressed_payload", "compressed_scale"),
                        _cache(where, "compressed", actual, want, slots, "compressed", budget)))
        results.append((("index_payload", "index_scale"),
                        _cache(where, "index", actual, want, slots, "index", budget)))
    elif kind is not LayerKind.SWA:
        results.append((("compressed_payload", "compressed_scale"), _unchanged(where, "compressed", actual, inputs)))
        if kind is LayerKind.C1A_REINDEX:
            results.append((("index_payload", "index_scale"), _unchanged(where, "index", actual, inputs)))
    if "gathered" in expected:
        results.append((("gathered",), _gathered(where, actual["gathered"], want["gathered"], active)))
    if "state_cache" in expected:
        results.append((("state_cache",), _state(where, actual["state_cache"], want["state_cache"],
                                                 inputs["state_cache"])))
    if "candidate_mask" in expected:
        results.append((("candidate_mask",),
                        _exact(f"{where}: candidate_mask", actual["candidate_mask"], want["candidate_mask"])))
    return _pick(results, only)


def _selection(where: str, kind: LayerKind, actual: Tensors, expected: Tensors, inputs: Tensors, active: int,
               block_size: int, scores, reference_for) -> tuple[CheckResult, Tensors]:
    """(the top-k selection's verdict, the outputs the rest is judged against): exact where the mode reuses a
    selection or it equals the reference's; else an overlap (C2A FULL) or a validity check against the reference
    scores, and an accepted alternative's own reference outputs (``reference_for``)."""
    sel, ref_sel = actual["topk_indices"], expected["topk_indices"]
    same = sel.dtype == ref_sel.dtype and sel.shape == ref_sel.shape and torch.equal(sel, ref_sel)
    if kind in REUSE or same:
        return _exact(f"{where}: topk_indices", sel, ref_sel), expected
    ctx = TopKContext(inputs["compressed_block_table"], inputs["token_to_req_indices"][:active],
                      inputs["compressed_lens"][:active], block_size)
    if kind is LayerKind.C2A_FULL:
        verdict = check_topk_overlap(sel, ref_sel, name=f"{where}: topk_indices")
    elif scores is None:
        verdict = failed("check_topk_validity", "§5.3", 1, 1, Violation(
            f"{where}: topk_indices", (), "a selection that differs from the reference",
            "the reference selection (no reference scores were given to judge an alternative)"))
    else:
        verdict = check_topk_validity(sel, ref_sel, ctx, scores() if callable(scores) else scores,
                                      name=f"{where}: topk_indices")
    if verdict.ok and reference_for is not None:
        return verdict, reference_for(sel)  # the output reference for the accepted selection
    return verdict, expected


def _state(where: str, a: torch.Tensor, e: torch.Tensor, before: torch.Tensor) -> CheckResult:
    """The compressor's state ring: the rows the reference rewrote judged by ``check_state``, the rest kept."""
    if a.dtype != e.dtype or a.shape != e.shape:
        return failed("check_state", "§6", 1, 1, Violation(f"{where}: state_cache.layout", (),
                                                           f"{a.dtype}{list(a.shape)}", f"{e.dtype}{list(e.shape)}"))
    rows = a.shape[0] * a.shape[1]
    touched = (byte_rows(e.reshape(rows, -1)) != byte_rows(before.reshape(rows, -1))).any(1)
    return cache_checks.check_state(f"{where}: state_cache", a.reshape(rows, -1), e.reshape(rows, -1), touched)


def _gathered(where: str, actual: torch.Tensor, expected: torch.Tensor, active: int) -> CheckResult:
    """The all-gathered input of the sharded wiring: active rows within ratio_allclose(2^-6, 2^-6) (one BF16 step
    tolerated, a mis-mapped row caught), the rows past them byte-exact (the caller's sentinel). Spec: §6, AP-21."""
    if actual.dtype != expected.dtype or tuple(actual.shape) != tuple(expected.shape):
        return failed("check_gathered", "§6", 1, 1, Violation(f"{where}: gathered.layout", (),
                                                               f"{actual.dtype}{list(actual.shape)}",
                                                               f"{expected.dtype}{list(expected.shape)}"))
    results = [check_ratio_allclose(actual[:active], expected[:active], atol=GATHER_TOL, rtol=GATHER_TOL,
                                    name=f"{where}: gathered")]
    if active < actual.shape[0]:
        results.append(_exact(f"{where}: gathered inactive row", actual[active:], expected[active:], offset=active))
    return first_failure(results)


def _pick(results: list[tuple[tuple[str, ...], CheckResult]], only: str | None) -> CheckResult:
    chosen = [r for names, r in results if only is None or only in names]
    if not chosen:
        return failed("judge_half_layer", "§6", 1, 1, Violation("output", (), repr(only), "an output of this mode"))
    bad = next((r for r in chosen if not r.ok), None)
    return bad if bad is not None else passed("judge_half_layer", "§6", sum(r.n_checked for r in chosen))


def _exact(name: str, a: torch.Tensor, e: torch.Tensor, *, offset: int = 0) -> CheckResult:
    """Byte identity; the first differing element is named by its index (rows shifted by ``offset``)."""
    if a.dtype != e.dtype or tuple(a.shape) != tuple(e.shape):
        return failed("check_exact", "§6", 1, 1, Violation(f"{name}.layout", (), f"{a.dtype}{list(a.shape)}",
                                                             f"{e.dtype}{list(e.shape)}"))
    diff = byte_rows(a.reshape(-1, 1)) != byte_rows(e.reshape(-1, 1))
    if not bool(diff.any()):
        return passed("check_exact", "§6", a.numel())
    flat = int(diff.any(1).nonzero()[0, 0])
    idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(flat), a.shape))
    idx = (idx[0] + offset, *idx[1:])
    bad = int(diff.any(1).sum())
    return failed("check_exact", "§6", a.numel(), bad,
                  Violation(name, idx, a.reshape(-1)[flat].item(), e.reshape(-1)[flat].item()))


BOUNDS = (
    Bound("half_layer", "per mode: the output by the FP8 budget (decode) or the row rule (prefill), caches by "
          "ownership and their format, the gather, the Top-K rule; an alternative selection judged against the "
          "reference recomputed for it",
          {**{f"fp8_budget.{k}": v for k, v in dataclasses.asdict(FP8_BUDGET).items()},
           **{f"row_bound.{k}": v for k, v in dataclasses.asdict(ROW_BOUND).items()},
           "gather_tol": GATHER_TOL, "c2a_cache_max_rel_l2": C2A_MAX_REL_L2,
           "state_max_rel_l2": cache_checks.STATE_MAX_REL_L2, "topk_cutoff_atol": CUTOFF_ATOL,
           "topk_cutoff_rtol": CUTOFF_RTOL, "topk_min_overlap": MIN_OVERLAP}),
)
