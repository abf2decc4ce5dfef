"""What every operator record (``kernels.record``) declares, judged on the backend under test: each bad call is
refused with ``ContractInputError`` naming its field, and each case's call at the tiny geometry returns the record's
outputs, each within its comparator of the reference. Written once for all records: a new operator's record brings
its rows here. Spec: §7.2.
"""

from __future__ import annotations

import pytest
import torch

from backends import torch_backend
from contracts.compare import Context, compare_all
from kernels.errors import ContractInputError
from kernels.record import geometry_config, records
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op, operator_params

REF = torch_backend()
BAD_CALLS = {f"{r.operator}: {b.name}": (r, b) for r in records().values() for b in r.bad_calls}
CASES = {f"{r.operator}: {c.name}": (r, c) for r in records().values() for c in r.cases
         if r.small_geometry(c.name)}


def _at(record, case: str, seed: int = 5):
    """(inputs, config) of a record's case at its small geometry."""
    spec = record.case(case)
    config = geometry_config(record.small_geometry(case))
    return spec.build(seed, spec.wirings[0], config), config


@pytest.mark.parametrize("key", operator_params(BAD_CALLS, lambda row: row[0].operator))
def test_each_bad_call_of_a_record_is_refused_naming_its_field(backend, key):
    """The record's bad call is refused by the reference first (so the row itself is bad input), then by the
    backend, with ``ContractInputError`` naming the same field: accepting it, or refusing it for another field,
    fails."""
    record, bad = BAD_CALLS[key]
    inputs, config = _at(record, bad.case)
    inputs = bad.change(inputs)
    with pytest.raises(ContractInputError) as ref:
        record.call(REF.get(record.operator), dict(inputs), config)
    assert bad.field in str(ref.value), f"the reference refuses {key} for another reason: {ref.value}"
    try:
        record.call(op(backend, record.operator), dict(inputs), config)
    except ContractInputError as exc:
        assert bad.field in str(exc), f"{key}: refused, but naming {exc.field!r}, not {bad.field!r}: {exc}"
    else:
        raise AssertionError(f"{record.operator} accepted bad input ({key}): expected ContractInputError on "
                             f"{bad.field!r}")


@pytest.mark.parametrize("key", operator_params(CASES, lambda row: row[0].operator))
def test_each_record_case_matches_the_reference_within_its_comparators(backend, key):
    """The case's call returns exactly the record's outputs, each judged by its comparator against the reference on
    the same inputs (seed 5: not the seed the sample store's trees were recorded with)."""
    record, spec = CASES[key]
    inputs, config = _at(record, spec.name)
    want = record.call(REF.get(record.operator), {k: v.clone() for k, v in inputs.items()}, config)
    got = record.call(op(backend, record.operator), {k: v.clone() for k, v in inputs.items()}, config)
    assert sorted(got) == sorted(record.outputs), f"{key}: outputs {sorted(got)}, the record says {sorted(record.outputs)}"
    ctx = Context(inputs=inputs, actual_outputs=got, expected_outputs=want, params=dict(spec.params))
    comparators = record.comparators(record.small_geometry(spec.name))
    failures = {name: r for name, r in compare_all(comparators, ctx).items() if not r.ok}
    assert not failures, f"{key}: " + "; ".join(f"{name}: {r}" for name, r in failures.items())


def _gate_unchecked(x_mixed, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids, *, config,
                    **kw):
    """v4_gate that clamps num_tokens and ids instead of refusing them (a kernel without the caller-side checks)."""
    num_tokens = min(int(num_tokens), x_mixed.shape[0])
    input_ids = input_ids.clamp(0, tid2eid.shape[0] - 1)
    layer_id = min(int(layer_id), config.num_hidden_layers)
    if gate_w.shape[1] != x_mixed.shape[1]:
        gate_w = torch.nn.functional.pad(gate_w, (0, x_mixed.shape[1] - gate_w.shape[1]))
    return REF.get("v4_gate")(x_mixed, norm_w, gate_w, gate_bias, layer_id, num_tokens, tid2eid, input_ids,
                              config=config, **kw)


def _gate_weights_unnormalised(*args, **kw):
    out = REF.get("v4_gate")(*args, **kw)
    return {**out, "weights": out["weights"] * 1.01}


SEEDED_DEFECTS = [
    SeededDefect("record:gate-accepts-bad-calls", "v4_gate", _gate_unchecked,
                 "test_each_bad_call_of_a_record_is_refused_naming_its_field", "accepted bad input"),
    SeededDefect("record:gate-weights-off-by-1pct", "v4_gate", _gate_weights_unnormalised,
                 "test_each_record_case_matches_the_reference_within_its_comparators", "weights"),
]
