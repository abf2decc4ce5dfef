"""The mutation runner itself (the full run is on demand: ``python -m tests.mutation.run``)."""

from __future__ import annotations

import pytest

from tests.harness import contracts_for, run_contract
from tests.mutation import engine
from tests.mutation.equivalent import EQUIVALENT


def test_mutant_keys_are_unique_and_every_module_has_mutants():
    mutants = engine.all_mutants()
    keys = [m.key for m in mutants]
    assert len(keys) == len(set(keys)), "two mutants share a key"
    for module in engine.MODULES:
        assert engine.mutants_of(module), f"no mutant generated for {module}"


def test_every_equivalent_entry_names_a_generated_mutant_and_gives_a_reason():
    keys = {m.key for m in engine.all_mutants()}
    stale = sorted(set(EQUIVALENT) - keys)
    assert not stale, f"tests/mutation/equivalent.py lists mutants that no longer exist: {stale[:5]}"
    short = [k for k, why in EQUIVALENT.items() if len(why) < 30]
    assert not short, f"equivalent mutants need a reason: {short[:5]}"


@pytest.mark.parametrize("module", ["kernels.quant", "kernels.metadata", "contracts.checks.precision"])
def test_an_unmutated_shadow_passes_its_contracts(module):
    """The control: a shadow copy without a mutation passes the contracts (a kill is never the loader's)."""
    loaded = engine.load_shadow(None, module)
    try:
        backend = engine.shadow_backend(loaded, "control")
        for op in engine.operators_of(loaded):  # a composition comes bound to the backend's operators (a partial)
            fn = backend.get(op)
            assert getattr(fn, "func", fn).__module__.startswith("_pto_mutant"), op
        fns = contracts_for(engine.operators_of(loaded))[:4]
        assert fns
        for fn in fns:
            outcome = run_contract(fn, backend, stop_at_first=True)
            assert outcome.passed, f"{outcome.contract}: {outcome.text()[:400]}"
    finally:
        engine.unload(loaded)


def test_a_midpoint_mutant_is_killed_and_the_reference_is_untouched():
    """Moving the 0.75 E2M1 midpoint is caught by a contract; the pristine reference keeps its value."""
    from kernels import quant
    from tests.mutation.run import run_one

    mutant = next(m for m in engine.mutants_of("kernels.quant") if m.key == "kernels.quant:<module>:const:0.75->1.5#0")
    row = run_one(mutant, [], timeout=120)
    assert row["status"] == "killed" and row["how"] == "fail", row
    assert quant.FP4_MIDPOINTS[1] == 0.75


def test_the_clause_run_finds_drops_and_targets_each_clause():
    """tests.mutation.clauses: every listed equivalent clause still exists (no stale entry); a clause's drop
    changes exactly that clause (an `if` never taken, an `expect` gone) and the module still parses; the tests
    chosen for a metadata clause include the contract that runs its check and that contract's seeded-defect
    cases."""
    import ast

    from tests.mutation import clauses as c

    found = {m: c.clauses_of(m) for m in c.MODULES}
    every = [x for xs in found.values() for x in xs]
    assert len(every) >= 100 and all(x.source for x in every)
    keys = {(f"{x.module}:{x.func}", x.source) for x in every}
    assert set(c.EQUIVALENT) <= keys, f"stale EQUIVALENT entries: {set(c.EQUIVALENT) - keys}"
    window = next(x for x in found["contracts.checks.metadata"] if x.func == "check_window"
                  and x.source.startswith("t.expect('window_slots', (tok,), slots[tok], b.slot"))
    before, after = c._path(window.module).read_text(), c.mutated(window)
    ast.parse(after)
    assert "b.slot(row, p))" in before and after.count("b.slot(row, p))") == ast.unparse(ast.parse(before)).count(
        "b.slot(row, p))") - 1
    tests = c.tests_for(window, c._test_index(), c._seeded_defect_cases())
    assert "contracts/test_metadata.py::test_metadata_window" in tests
    assert any("test_seeded_defects.py" in t and "test_metadata_window" in t for t in tests), tests


def test_the_last_killer_runs_first_and_the_history_follows_each_run(tmp_path):
    """--history only reorders: the contract that killed a mutant last time moves to the front, the rest keep
    their order; a run records each kill, and a mutant that survives (or only the replay kills) is forgotten."""
    from tests.mutation.run import first_killer_first, load_history, save_history

    fns = contracts_for({"mx_quantize"})
    assert len(fns) > 2
    last = fns[-1]
    name = f"{last.__module__.split('.')[-1]}::{last.__name__}"
    ordered = first_killer_first(fns, name)
    assert ordered[0] is last and ordered[1:] == fns[:-1] and sorted(map(id, ordered)) == sorted(map(id, fns))
    assert first_killer_first(fns, None) == fns and first_killer_first(fns, "test_x::gone") == fns
    path = tmp_path / "history.json"
    assert load_history(path) == {}
    path.write_text("not json")
    assert load_history(path) == {}
    save_history(path, [{"key": "a", "status": "killed", "by": "test_q::t1"},
                        {"key": "b", "status": "killed", "by": "timeout"},
                        {"key": "c", "status": "killed", "by": "test_q::t2"}])
    assert load_history(path) == {"a": "test_q::t1", "c": "test_q::t2"}
    save_history(path, [{"key": "a", "status": "survived", "by": ""}, {"key": "c", "status": "killed", "by": "test_q::t3"}])
    assert load_history(path) == {"c": "test_q::t3"}
