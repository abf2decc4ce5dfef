"""Teacher-forced comparators: a device's stage judged against the reference re-run on the device's own inputs.

A long chain (attention, then mHC, then MoE) accumulates the device's arithmetic error; compared with the
reference chain end to end, the mHC step would be judged on the attention's error. Upstream's layer tests
instead replay each stage of the reference on what the device fed that stage, so each stage is judged alone.

* ``check_hc_mixes_forced`` (HC-09): the reference's ``hc_mixes`` on the device's own residual stream; every
  coefficient (pre, post, residual) within ``MIX_ROW_TOL`` (5e-3) in the worst token row, and every replica
  (one set of mixes per rank of a TP group) bit-identical to the first.
* ``check_hc_post_forced`` (HC-10): the reference's ``hc_post`` on the device's own sublayer output, streams
  and mixes; the device's expanded stream within ``budget`` relative L2 (1 % after attention; a MoE chain passes
  its own budget).

* ``check_stage_forced`` (AP-12): any stage (upstream: the attention after the mHC collapse) judged by its own
  comparator against its reference re-run on the device's own stage input (with the state the stage started
  from); the end-to-end difference against the reference chain is reported on failure, never gated.
* ``forced_index_input`` (IX-13): the input the Top-K cutoff rule rebuilds its index scores from -- in the
  sharded wiring the device's own all-gathered input, never the reference's gather of the slabs.

Spec: upstream_checks HC-09, HC-10, AP-12, IX-13 (prefill_layer.py compare_hc_mixes_output /
compare_expanded_stream, prefill_c2a_full.py compare_x_hc_out and StagedAttentionReference,
decode_c1a_full.py hc_topk_indices_compare).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from contracts.evidence import same_bytes
from contracts.result import CheckResult, Violation, failed, passed
from contracts.tolerances import MIX_ROW_TOL, POST_REL_L2
from kernels.config import V41Config
from kernels.reference import mhc


def check_hc_mixes_forced(device_x_hc: torch.Tensor, device_mixes: Sequence[mhc.Mixes], function: torch.Tensor,
                          scale: torch.Tensor, base: torch.Tensor, *, config: V41Config,
                          num_tokens: int | None = None, tol: float = MIX_ROW_TOL) -> CheckResult:
    """``device_mixes``: one Mixes per replica (rank), computed by the device from ``device_x_hc``. Spec: HC-09."""
    check, spec = "check_hc_mixes_forced", "HC-09"
    if not device_mixes:
        return failed(check, spec, 1, 1, Violation("device_mixes", (), "no replica", "one Mixes per rank"))
    first = device_mixes[0]
    for rank, other in enumerate(device_mixes[1:], start=1):
        for name in ("pre", "post", "residual"):
            a, b = getattr(other, name), getattr(first, name)
            if not same_bytes(a, b):
                where = (~(a == b)).nonzero()[0].tolist() if a.shape == b.shape else []
                return failed(check, spec, len(device_mixes), 1,
                              Violation(f"replica {rank} {name}", tuple(where), "differs", "replica 0's bytes",
                                        note="replicas of one TP group must be identical"))
    want = mhc.hc_mixes(device_x_hc, function, scale, base, num_tokens=num_tokens, config=config)
    rows = want.pre.shape[0]
    for name in ("pre", "post", "residual"):
        got, ref = getattr(first, name).double(), getattr(want, name).double()
        if got.shape != ref.shape:
            return failed(check, spec, 1, 1, Violation(f"{name}.layout", (), list(got.shape), list(ref.shape)))
        err = (got - ref).abs().reshape(rows, -1)
        if not bool(torch.isfinite(err).all()):
            row = int((~torch.isfinite(err)).any(1).nonzero()[0, 0])
            return failed(check, spec, rows, 1, Violation(name, (row,), "non-finite", "finite"))
        per_row = err.amax(1) if err.shape[1] else torch.zeros(rows, dtype=torch.float64)
        if rows and float(per_row.max()) > tol:
            row = int(per_row.argmax())
            return failed(check, spec, rows, int((per_row > tol).sum()),
                          Violation(name, (row,), float(per_row[row]), 0.0, tol,
                                    note="worst coefficient of the token row, against hc_mixes re-run on the "
                                         "device's own residual stream"))
    return passed(check, spec, rows)


def check_hc_post_forced(device_out: torch.Tensor, device_sublayer: torch.Tensor, device_x_hc: torch.Tensor,
                         post_mix: torch.Tensor, residual_mix: torch.Tensor, *,
                         budget: float = POST_REL_L2) -> CheckResult:
    """The device's expanded stream [T, hc, D] against ``hc_post`` re-run on its own sublayer output [T, D],
    streams [T, hc, D] and mixes. Spec: HC-10."""
    check, spec = "check_hc_post_forced", "HC-10"
    want = mhc.hc_post(device_sublayer, device_x_hc, post_mix, residual_mix)
    if device_out.shape != want.shape:
        return failed(check, spec, 1, 1, Violation("x_hc_out.layout", (), list(device_out.shape), list(want.shape)))
    a, e = device_out.double(), want.double()
    if not bool(torch.isfinite(a).all()):
        idx = tuple(int(v) for v in (~torch.isfinite(a)).nonzero()[0])
        return failed(check, spec, a.numel(), 1, Violation("x_hc_out", idx, float(a[idx]), float(e[idx])))
    ref = float(e.norm())
    rel = float((a - e).norm()) / ref if ref > 0 else float((a - e).norm())
    if rel > budget:
        per_row = (a - e).reshape(a.shape[0], -1).norm(dim=1)
        return failed(check, spec, a.shape[0], a.shape[0],
                      Violation("x_hc_out", (), rel, 0.0, budget,
                                note=f"relative L2 against hc_post re-run on the device's own sublayer output; "
                                     f"worst token row {int(per_row.argmax())}"))
    return passed(check, spec, a.shape[0])


def check_stage_forced(device_output: torch.Tensor, device_input: torch.Tensor,
                       rerun: Callable[[torch.Tensor], torch.Tensor],
                       judge: Callable[[torch.Tensor, torch.Tensor], CheckResult], *,
                       chain_expected: torch.Tensor | None = None) -> CheckResult:
    """``judge(device_output, rerun(device_input))``: the stage judged by its own comparator against its reference
    re-run on what the device fed it. On a failure, the cause also gives the end-to-end relative L2 against
    ``chain_expected`` (the reference chain's output), which is reported and never gated. Spec: AP-12."""
    verdict = judge(device_output, rerun(device_input))
    if verdict.ok or chain_expected is None:
        return verdict
    a, e = device_output.double(), chain_expected.double()
    end = float((a - e).norm() / e.norm()) if a.shape == e.shape and float(e.norm()) > 0 else float("nan")
    return dataclasses.replace(verdict, cause=(verdict.cause + "; " if verdict.cause else "") +
                               f"judged against the stage re-run on the device's own input (teacher forcing); "
                               f"end-to-end relative L2 {end:.3g} (reported, not gated)")


def forced_index_input(inputs: dict, actual_outputs: dict, *, wiring: str, tp: int) -> dict:
    """The half-layer inputs the Top-K cutoff rule rebuilds its index scores from (IX-13): in the sharded wiring
    the slabs are rebuilt from the device's own all-gathered input (``actual_outputs["gathered"]``, active rows),
    so a selection is judged on what the device attended from; otherwise (or when the device returned no
    gather) the stored inputs. Spec: IX-13."""
    gathered = actual_outputs.get("gathered")
    if wiring != "sharded" or gathered is None or "x" not in inputs:
        return inputs
    from kernels.sequence_parallel import sp_bounds

    active, tokens = int(inputs["num_tokens"]), int(inputs["position_ids"].shape[0])
    slabs = torch.zeros_like(inputs["x"])
    if gathered.shape[0] < active or gathered.shape[-1] != slabs.shape[-1]:
        return inputs  # a gather of the wrong layout fails its own clause; the scores stay the reference's
    for rank, b in enumerate(sp_bounds(active, tp, tokens)):
        slabs[rank, :b.count] = gathered[b.first:b.first + b.count].to(slabs.dtype)
    return {**inputs, "x": slabs}
