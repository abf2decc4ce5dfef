"""Quantized cache and state comparators, as pure checks on raw bytes plus decoded values.

Callers pass decoded values (from the backend's decoder), so these checks never import a codec.
Rows are flattened physical rows ``[blocks*rows_per_block, ...]``.

Spec: §6 (quantized_cache_compare, compare_cache, compare_scales, compare_state, compare_unchanged).
"""

from __future__ import annotations

import torch

from contracts.result import Bound, CheckResult, Tally, Violation, failed, first_failure, passed
from contracts.tensors import byte_rows

MAX_REL_L2 = {"mxfp8": 0.01, "mxfp4": 0.04}  # CACHE_MAX_RELATIVE_L2 (§6)
C2A_MAX_REL_L2 = 0.01  # decode_attn_c2a_full.compare_cache: every payload, MXFP4 included (§6)
STATE_MAX_REL_L2 = 0.005  # compare_state (§6)


def _flat_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return t.reshape(rows, -1)


def check_bytes_outside(name: str, actual: torch.Tensor, expected: torch.Tensor, mapped: torch.Tensor) -> CheckResult:
    """Rows not in ``mapped`` (bool [rows]) are byte-identical. Names the cache, row and byte."""
    check, spec = "check_bytes_outside", "§6"
    rows = mapped.numel()
    if actual.dtype != expected.dtype or tuple(actual.shape) != tuple(expected.shape):
        return failed(check, spec, 1, 1, Violation(f"{name}.layout", (), f"{actual.dtype}{list(actual.shape)}",
                                                   f"{expected.dtype}{list(expected.shape)}"))
    a, e = byte_rows(_flat_rows(actual, rows)), byte_rows(_flat_rows(expected, rows))
    diff = (a != e) & ~mapped.reshape(-1, 1)
    if not bool(diff.any()):
        return passed(check, spec, int((~mapped).sum()))
    row, byte = (int(v) for v in diff.nonzero()[0])
    return failed(check, spec, int((~mapped).sum()), int(diff.any(1).sum()),
                  Violation(f"{name} row", (row,), f"byte {byte} = 0x{int(a[row, byte]):02x}",
                            f"0x{int(e[row, byte]):02x}", note="unmapped row changed"))


def check_bytes_inside(name: str, actual: torch.Tensor, expected: torch.Tensor, mapped: torch.Tensor) -> CheckResult:
    """Rows in ``mapped`` are byte-identical (scale tensors on published rows)."""
    return check_bytes_outside(name, actual, expected, ~mapped)


def check_mapped_values(name: str, actual_values: torch.Tensor, expected_values: torch.Tensor, mapped: torch.Tensor,
                        *, max_rel_l2: float) -> CheckResult:
    """Decoded mapped rows are finite and within ``max_rel_l2`` relative L2 of the expected decode."""
    check, spec = "check_mapped_values", "§6"
    rows = mapped.numel()
    a = actual_values.reshape(rows, -1)[mapped].double()
    e = expected_values.reshape(rows, -1)[mapped].double()
    if a.numel() == 0:
        return passed(check, spec, 0)
    bad = ~torch.isfinite(a)
    if bool(bad.any()):
        r = int(bad.any(1).nonzero()[0, 0])
        row = int(mapped.nonzero()[r, 0])
        return failed(check, spec, a.shape[0], int(bad.any(1).sum()),
                      Violation(f"{name} row", (row,), "non-finite", "finite"))
    ref = float(e.norm())
    rel = float((a - e).norm()) / ref if ref > 0 else float((a - e).norm())
    if rel > max_rel_l2:
        per_row = (a - e).norm(dim=1)
        row = int(mapped.nonzero()[int(per_row.argmax()), 0])
        return failed(check, spec, a.shape[0], a.shape[0],
                      Violation(name, (), rel, 0.0, max_rel_l2, note=f"relative L2 over mapped rows; worst row {row}"))
    return passed(check, spec, a.shape[0])


def check_quantized_cache(name: str, actual: tuple, expected: tuple, mapped: torch.Tensor, *,
                          actual_values: torch.Tensor, expected_values: torch.Tensor, fmt: str,
                          scales_exact: bool = True, max_rel_l2: float | None = None) -> CheckResult:
    """Quantized cache compare: payload and scale bytes of unmapped rows exact; scales exact on mapped rows;
    mapped rows finite and within the format's relative L2 (MXFP8 0.01, MXFP4 0.04, or ``max_rel_l2``: the
    decode C2A ``compare_cache`` holds MXFP4 payloads to 0.01). ``actual``/``expected`` are ``(payload, scale)``.
    Spec: §6."""
    (ap, as_), (ep, es) = actual, expected
    results = [check_bytes_outside(f"{name}.payload", ap, ep, mapped),
               check_bytes_outside(f"{name}.scale", as_, es, mapped)]
    if scales_exact:
        results.append(check_bytes_inside(f"{name}.scale", as_, es, mapped))
    budget = MAX_REL_L2[fmt] if max_rel_l2 is None else max_rel_l2
    results.append(check_mapped_values(name, actual_values, expected_values, mapped, max_rel_l2=budget))
    return first_failure(results)


def check_state(name: str, actual: torch.Tensor, expected: torch.Tensor, touched: torch.Tensor) -> CheckResult:
    """Ratio-2 state: untouched ring slots byte-exact; whole state within 0.5 % relative L2.
    ``touched`` bool [blocks*capacity]. Spec: §6 (compare_state)."""
    results = [check_bytes_outside(f"{name}.slot", actual, expected, touched)]
    a, e = actual.double(), expected.double()
    ref = float(e.norm())
    rel = float((a - e).norm()) / ref if ref > 0 else float((a - e).norm())
    t = Tally("check_state", "§6")
    t.n_checked = touched.numel()
    if not torch.isfinite(a).all() or rel > STATE_MAX_REL_L2:
        t.fail(Violation(name, (), rel, 0.0, STATE_MAX_REL_L2, note="relative L2 of the state"))
    results.append(t.result())
    return first_failure(results)


def check_unchanged(name: str, before: torch.Tensor, after: torch.Tensor) -> CheckResult:
    """Non-owner storage (payloads and FP8 scales alike) is byte-identical. Spec: §6 (compare_unchanged)."""
    rows = before.shape[0] if before.ndim else 1
    return check_bytes_outside(name, after, before, torch.zeros(rows, dtype=torch.bool))


def check_resident_sentinels(window_cache: torch.Tensor, caches: dict[str, tuple[torch.Tensor, list[int]]]
                             ) -> CheckResult:
    """The resident CED's sentinel storage stays as allocated (zero bytes; a -0.0 is a write): the last window
    page of every layer, ``window_cache`` [ranks, layers, pages, ...], and, for each cache of ``caches`` (name ->
    (tensor [ranks, slots, rows, ...], the rows each slot uses)), every row of a slot from its used count on, on
    every rank. A failure names the first sentinel written (cache, layer or slot, rank, element) and counts
    them all; the note lists every failing sentinel as upstream's failure list does. Spec: upstream_checks CQ-24."""
    check, spec = "check_resident_sentinels", "CQ-24"
    regions = [(f"window_sentinel_{layer}", window_cache[:, layer, -1]) for layer in range(window_cache.shape[1])]
    for name, (tensor, used) in caches.items():
        if len(used) != tensor.shape[1]:
            return failed(check, spec, 1, 1, Violation(f"{name}.used", (), f"{len(used)} counts",
                                                       f"one per slot ({tensor.shape[1]})"))
        regions += [(f"{name}_sentinel_{slot}", tensor[:, slot, n:]) for slot, n in enumerate(used)]
    failures, first = [], None
    for label, region in regions:
        for rank in range(region.shape[0] if region.numel() else 0):
            verdict = check_unchanged(f"{label} rank{rank}", torch.zeros_like(region[rank]), region[rank])
            if not verdict.ok:
                failures.append(label)
                first = first or verdict.worst
                break
    if not failures:
        return passed(check, spec, len(regions))
    return failed(check, spec, len(regions), len(failures),
                  Violation(first.field, first.index, first.actual, first.expected,
                            note=f"sentinels written: {', '.join(failures)}"))


BOUNDS = (
    Bound("state_ring", "rows the reference did not touch byte for byte; the whole state by relative L2",
          {"max_rel_l2": STATE_MAX_REL_L2}),
    Bound("cache_payload", "unmapped rows and every scale byte for byte; mapped rows decoded within the format's "
          "relative L2", {f"{fmt}_max_rel_l2": v for fmt, v in MAX_REL_L2.items()}),
)
