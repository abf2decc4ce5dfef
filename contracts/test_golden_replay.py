"""Replay every tree of the golden store (``--golden-store``, default artifacts/store) on the selected
backend, one test per (case, wiring). Reads use read-only sessions, so xdist workers share the store.
A stale tree fails with the regen hint; ``--regen-goldens`` regenerates it and still fails. A missing
or empty store fails; only an operator the backend lacks is a skip (naming backend and operator).
Spec: §7.3."""

from __future__ import annotations

import pytest


def _trees(store_path: str) -> list[tuple[str, str, frozenset[str]]]:
    """(case, wiring, the operators the tree reaches) of every tree in the store."""
    from goldens import trees
    from goldens.store import GoldenStore

    store = GoldenStore(store_path)
    if not store.exists():
        return []
    reader = store.reader()
    return [(c, w, trees.tree_operators(reader, c, w)) for c in trees.recorded_cases(reader)
            for w in trees.recorded_wirings(reader, c)]


def pytest_generate_tests(metafunc):
    if "golden_tree" in metafunc.fixturenames:
        from goldens.errors import GoldenStoreError

        path = metafunc.config.getoption("golden_store")
        try:
            found = _trees(path)
        except GoldenStoreError as exc:  # unreadable or unreachable: one failing test that says why
            metafunc.parametrize("golden_tree", [("!unreadable", str(exc))], ids=["store-unreadable"])
            return
        # an absent or empty store is an error, not a skip: the default store is committed with the repo
        # each tree declares the operators it reaches, so `pytest --operator NAME` replays the trees of NAME
        params = [pytest.param((c, w), marks=pytest.mark.operators(*sorted(ops)), id=f"{c}/{w}") for c, w, ops in found]
        metafunc.parametrize("golden_tree", params or [pytest.param(None, id="no-trees")])


def test_golden_tree_replays(backend, golden_tree, pytestconfig, request):
    from goldens import trees
    from goldens.errors import BackendFailure, GoldenStoreError
    from goldens.store import GoldenStore
    from goldens.verdicts import judge

    path = pytestconfig.getoption("golden_store")
    if golden_tree is None:
        pytest.fail(f"no replay trees in a golden store at {path}: record some with `goldens record` "
                    "or point --golden-store at an existing store")
    case, wiring = golden_tree
    if case == "!unreadable":
        pytest.fail(wiring, pytrace=False)
    store = GoldenStore(path)
    tree = trees.load_tree(store.reader(), case, wiring)
    if tree.stale:
        if pytestconfig.getoption("regen_goldens"):
            report, result = trees.regen(store, [(case, wiring)])
            moved = [d.name for _c, _w, ds in report for d in ds]
            pytest.fail(f"{case}/{wiring} was stale and has been regenerated (outputs moved: {moved or 'none'}; "
                        f"snapshot {result.snapshot}); rerun to replay it")
        from goldens.replay import stale_advice

        advice = stale_advice(tree)  # as `goldens replay` says it: whether the outputs move past their comparators
        _report(pytestconfig.getoption("golden_report"), case, wiring, "STALE", advice)
        pytest.fail(f"{case}/{wiring} is stale: {advice} (or --regen-goldens)")
    report_dir = pytestconfig.getoption("golden_report")
    asking = _Asking(backend)
    try:
        judged = judge(tree, asking)  # the verdicts goldens replay gives, from the one place they are decided
    except GoldenStoreError as exc:
        _report(report_dir, case, wiring, "ERROR", str(exc))
        pytest.fail(str(exc))
    if judged.verdict in ("SKIP", "ERROR"):
        _report(report_dir, case, wiring, judged.verdict, judged.detail)
        if judged.verdict == "SKIP":  # the operator it lacks (e.g. no toolchain) / a call it cannot run
            pytest.skip(judged.detail)
        raise BackendFailure(judged.detail)  # the backend raised: the test errors with it
    results, actual = judged.results, judged.actual
    if report_dir:
        from goldens import report

        report.write_part(report_dir, report.tree_report(report.History(store), tree, actual, results))
    declared = {name for mark in request.node.iter_markers("operators") for name in mark.args}
    assert asking.asked <= declared, (f"{case}/{wiring}: its replay asked the backend for {sorted(asking.asked - declared)}, "
                                      f"which the tree's record does not reach ({sorted(declared)}): "
                                      "contracts.operators.operators_reached misses them")
    failed = {name: r.message() for name, r in results.items() if not r.ok}
    assert not failed, f"{case}/{wiring}: " + "; ".join(f"{k}: {v}" for k, v in failed.items())


class _Asking:
    """The backend, counting the operators a replay asks it for (everything else passes through)."""

    def __init__(self, backend):
        self._backend, self.asked = backend, set()

    def get(self, name: str):
        self.asked.add(name)
        return self._backend.get(name)

    def __getattr__(self, attr: str):
        return getattr(self._backend, attr)


def _report(report_dir: str | None, case: str, wiring: str, verdict: str, detail: str) -> None:
    if report_dir:
        from goldens import report

        report.write_part(report_dir, report.TreeReport(case, wiring, verdict, detail))
