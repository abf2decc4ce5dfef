"""Mixed runs: on a partial backend by nature (``Backend.reference_stand_ins``, as upstream's goldens of one folder
are), a contract that declares one of the backend's operators runs with the reference standing in for the ones it
lacks, and the summary says which; a contract with none of the backend's own, or one comparing a stage with its
own parts (``whole_backend``), still skips; a backend without stand-ins skips as before."""

from __future__ import annotations

import sys
from pathlib import Path

from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
TESTS = ["contracts/test_v4_moe.py::test_the_combine_is_one_fp32_sum_rounded_once",  # v4_moe + v4_gate + v4_expert
         "contracts/test_v4_moe.py::test_the_moe_stage_is_hc_pre_then_the_moe_then_hc_post",  # whole_backend
         "contracts/test_v4_gate.py::test_tied_experts_go_to_the_lower_id",  # v4_gate alone
         "contracts/test_slabs.py::test_slab_bounds_spec_examples"]  # none of the backend's own


def _pytest(target: str):
    proc = forkserver.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:xdist", *TESTS,
                           "--backend-module", target], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout


def test_a_partial_backend_runs_its_contracts_with_reference_stand_ins_labelled():
    code, out = _pytest("tests.partial_double:MIXED")
    assert code == 0, out[-3000:]
    summary = next(line for line in out.splitlines() if line.startswith("mixed runs:"))
    assert "v4_expert" in summary and "v4_moe" in summary and "v4_gate" not in summary, summary
    assert "combine_is_one_fp32_sum_rounded_once" not in _skipped(out), "the mixed contract was skipped whole"
    assert any("moe_stage_is_hc_pre_then_the_moe_then_hc_post" in s for s in _skipped(out)), \
        "a whole_backend contract ran mixed"
    assert any("slab_bounds_spec_examples" in s for s in _skipped(out)), "a contract of none of its own ran"


def test_without_stand_ins_the_same_contracts_skip_as_before():
    code, out = _pytest("tests.partial_double:WHOLE")
    assert code == 0, out[-3000:]
    assert not any(line.startswith("mixed runs:") for line in out.splitlines())
    assert any("combine_is_one_fp32_sum_rounded_once" in s for s in _skipped(out)), out[-2000:]


def _skipped(out: str) -> list[str]:
    return [line for line in out.splitlines() if " SKIPPED" in line and "::" in line]


def test_a_call_the_backend_cannot_take_gets_the_reference_unless_it_is_the_subjects():
    """A backend whose gate refuses every call as unsupported: the MoE contract (v4_moe composed around the gate)
    runs on the reference's gate for those calls, labelled a mixed run, and passes; the gate's own contract (its
    subject) skips naming why."""
    code, out = _pytest("tests.partial_double:PICKY")
    assert code == 0, out[-3000:]
    assert "combine_is_one_fp32_sum_rounded_once" not in _skipped(out), "the mixed contract was skipped whole"
    assert "PASSED" in next(line for line in out.splitlines() if "combine_is_one_fp32_sum_rounded_once" in line)
    assert any("tied_experts_go_to_the_lower_id" in s for s in _skipped(out)), "the gate's own contract ran"
    assert "this double's gate takes no call" in out, "the skip does not say why"


def test_a_whole_backend_chain_takes_only_its_named_inputs_from_the_reference():
    """``whole_backend(..., inputs=(...))``: the prefill MTP layer's chain on a backend without the window lowering
    runs with the reference's lowering (labelled a mixed run) and passes; on one without the fused head it still
    skips (a stage is compared with the backend's own parts)."""
    test = "contracts/test_v4_mtp_layer.py::test_the_prefill_mtp_layer_is_its_stages_in_order"
    for target, runs in (("tests.partial_double:NO_WINDOW", True), ("tests.partial_double:NO_HEAD", False)):
        proc = forkserver.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:xdist", test,
                               "--backend-module", target, "--allow-unavailable"], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:]
        lines = [line for line in proc.stdout.splitlines() if "prefill_mtp_layer_is_its_stages_in_order[" in line]
        assert len(lines) == 2 and all(("PASSED" if runs else "SKIPPED") in line for line in lines), (target, lines)
        mixed = next((line for line in proc.stdout.splitlines() if line.startswith("mixed runs:")), "")
        assert ("v4_prefill_swa_indices" in mixed) == runs, (target, mixed)


def test_the_two_fallbacks_of_a_composed_operator_agree():
    """A composed operator the backend cannot take a call of falls back to the reference composed over the
    backend's own operators, both when a contract calls it (``Backend.stand_in``) and when another stand-in
    composition calls it: both give the backend's own leaf, never the reference's (operators named after real ones,
    arithmetic of this test's own)."""
    from contracts.operators import Backend, Unsupported

    def composed(fn):
        fn.composes_operators = True
        return fn

    def leaf(x):
        return x + 10

    @composed
    def outer(x, ops=None):  # a layer: its stage, plus one
        return (ops or {"v4_attention_stage": inner})["v4_attention_stage"](x) + 1

    @composed
    def inner(x, ops=None):  # a stage: its leaf, doubled (the reference's own leaf when called plain)
        return 2 * (ops or {"hc_pre": leaf})["hc_pre"](x)

    def unsupported(x):
        raise Unsupported("this double's stage takes no call")

    unsupported.may_be_unsupported = True
    reference = Backend("ref", {"v4_decode_layer": outer, "v4_attention_stage": inner, "hc_pre": leaf})
    backend = Backend("picky", {"v4_attention_stage": unsupported, "hc_pre": lambda x: x + 100})
    direct = backend.stand_in("v4_attention_stage", reference)(1)
    in_layer = backend.stand_in("v4_decode_layer", reference)(1) - 1
    assert direct == in_layer == 202, (direct, in_layer)  # 2 * (1 + 100): the backend's leaf both times
