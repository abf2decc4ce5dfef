"""The house rules, checked on the source: product code (``contracts``, ``kernels``, ``goldens``, ``backends``,
``pto_pytest``, except their test modules) imports no test module, no two product modules and no two product
packages import each other in a circle (each package stands on its floor, ``FLOORS``), counting imports inside
functions too; no backend imports the golden store; the emulated twin takes nothing from
the references but their input validation.

A finding names the modules and the line of each import on the way, so a new circle is fixed where it starts.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contracts", "kernels", "goldens", "backends", "pto_pytest")
# The floors, lowest first: a package imports only packages on its own floor or below (checked on every import,
# at any depth of a module, test modules aside). kernels: the references and the operator vocabulary; contracts: the
# judges, the comparators, the registries and the Backend type; backends: the implementations under test; goldens:
# the store tool; pto_pytest: the pytest plugin and the seeded-defect helper.
FLOORS = ("kernels", "contracts", "backends", "goldens", "pto_pytest")


def _is_test(module: str) -> bool:
    return any(part.startswith("test_") or part == "conftest" for part in module.split("."))


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _resolve(module: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict) -> list[str]:
    """The project modules an import statement loads (the deepest known module of each dotted name)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")[: len(module.split(".")) - (0 if path.name == "__init__.py" else 1)]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join(parts + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


@cache
def import_graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    """{module: {imported module: line}} over every import statement, at any depth of the module."""
    known = _modules()
    graph: dict[str, dict[str, int]] = {}
    for module, path in known.items():
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _resolve(module, path, node, known):
                    if target != module:
                        edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph, known


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected groups of more than one product module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if _is_test(w):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if not _is_test(v) and v not in index:
            visit(v)
    return found


def test_product_code_imports_no_test_module():
    graph, known = import_graph()
    bad = [f"{known[m].relative_to(ROOT)}:{line} imports {t}" for m, edges in sorted(graph.items())
           if not _is_test(m) for t, line in edges.items() if _is_test(t)]
    assert not bad, "product code imports a test module:\n" + "\n".join(bad)


def test_no_two_product_modules_import_each_other_in_a_circle():
    graph, known = import_graph()
    found = circles(graph)
    detail = ["; ".join(f"{m} -> {t} ({known[m].relative_to(ROOT)}:{graph[m][t]})"
                        for m in group for t in graph[m] if t in group) for group in found]
    assert not found, "import circles:\n" + "\n".join(detail)


def package_arrows(graph: dict[str, dict[str, int]]) -> dict[tuple[str, str], list[str]]:
    """{(package, package it imports): [module:line -> module, ...]} over product modules of two packages."""
    _, known = import_graph()
    out: dict[tuple[str, str], list[str]] = {}
    for m, edges in sorted(graph.items()):
        for t, line in edges.items():
            if _is_test(m) or _is_test(t) or m.split(".")[0] == t.split(".")[0]:
                continue
            where = f"{known[m].relative_to(ROOT)}:{line} -> {t}" if m in known else f"{m}:{line} -> {t}"
            out.setdefault((m.split(".")[0], t.split(".")[0]), []).append(where)
    return out


def downward_violations(arrows: dict[tuple[str, str], list[str]], floors=FLOORS) -> list[str]:
    """The arrows that point up a floor (or into a package without one), each with the import that makes it."""
    rank = {p: i for i, p in enumerate(floors)}
    return [f"{a} (floor {rank.get(a)}) imports {b} (floor {rank.get(b)}): {w[0]}" + (f" (+{len(w) - 1} more)"
                                                                                  if len(w) > 1 else "")
            for (a, b), w in sorted(arrows.items()) if a not in rank or b not in rank or rank[b] > rank[a]]


def test_no_two_product_packages_import_each_other_in_a_circle():
    """Package level: every arrow points down the floors, so no package circle can form (``kernels`` ⇄
    ``contracts`` through ``@operator``, ``contracts`` ⇄ ``goldens`` through the plugin were the last ones)."""
    graph, _ = import_graph()
    arrows = package_arrows(graph)
    packages = {p: {b: 1 for (a, b) in arrows if a == p} for p in PACKAGES}
    assert not circles(packages), circles(packages)
    bad = downward_violations(arrows)
    assert not bad, "imports up a floor:\n" + "\n".join(bad)


def test_the_floor_check_finds_an_upward_arrow():
    """The package check can fail: a ground-floor module importing the plugin is an upward arrow and a circle."""
    graph = {"kernels.a": {"pto_pytest.plugin": 3}, "pto_pytest.plugin": {"kernels.a": 1}}
    arrows = {("kernels", "pto_pytest"): ["kernels/a.py:3 -> pto_pytest.plugin"],
              ("pto_pytest", "kernels"): ["pto_pytest/plugin.py:1 -> kernels.a"]}
    assert downward_violations(arrows) == [
        "kernels (floor 0) imports pto_pytest (floor 4): kernels/a.py:3 -> pto_pytest.plugin"]
    assert circles({"kernels": {"pto_pytest": 1}, "pto_pytest": {"kernels": 1}}) == [["kernels", "pto_pytest"]]
    assert circles(graph) == [["kernels.a", "pto_pytest.plugin"]]


def test_no_backend_imports_the_golden_store():
    graph, known = import_graph()
    bad = [f"{known[m].relative_to(ROOT)}:{line} imports {t}" for m, edges in sorted(graph.items())
           if m.split(".")[0] == "backends" for t, line in edges.items() if t.split(".")[0] == "goldens"]
    assert not bad, "a backend imports the store tool:\n" + "\n".join(bad)


def test_the_emulated_twin_takes_only_validation_from_the_references():
    """A name the twin imports from ``kernels`` must be an input check (``check_*``) or a plain fact (an error
    type, a constant), never an arithmetic helper: otherwise it would share the reference's bugs."""
    for path in (ROOT / "backends" / "emulated").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kernels"):
                for alias in node.names:
                    assert alias.name.startswith("check_") or alias.name.isupper() or alias.name.endswith("Error"), \
                        f"{path.relative_to(ROOT)}:{node.lineno} takes {alias.name} from {node.module}"


def test_the_walk_finds_a_circle_and_a_test_import_it_is_shown():
    """The walk itself can fail: a synthetic graph with a circle and a test import is reported."""
    graph = {"a.x": {"a.y": 1}, "a.y": {"a.x": 2, "a.test_z": 3}, "a.test_z": {}}
    assert circles(graph) == [["a.x", "a.y"]]
    assert circles({"a.x": {"a.y": 1}, "a.y": {}}) == []
    assert _is_test("contracts.test_v4_moe") and not _is_test("contracts.v4_inputs")


def test_pytest_reaches_the_store_through_one_door():
    """Of ``goldens``, the pytest plugin imports ``goldens.pytest_api`` alone, and that module imports no test."""
    graph, _ = import_graph()
    doors = sorted(t for t in graph["pto_pytest.plugin"] if t.split(".")[0] == "goldens")
    assert doors == ["goldens.pytest_api"], doors


def test_every_hypothesis_draw_is_labelled():
    """``data.draw(strategy, label=...)``: a failing example then prints each drawn value under a name."""
    bare = []
    for path in sorted((*ROOT.joinpath("contracts").rglob("*.py"), *ROOT.joinpath("tests").rglob("*.py"))):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "draw" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "data" \
                    and len(node.args) < 2 and not any(k.arg == "label" for k in node.keywords):
                bare.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bare, "unlabelled draws:\n" + "\n".join(bare)


def _module_level_numbers(path: Path) -> list[str]:
    """Module-level assignments of a name that says it is a bound (TOL, ATOL, RTOL, ULPS, BUDGET, RELDIFF, QUOTA)
    to a number or a tuple of numbers."""
    bad = []
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.Assign):
            continue
        names = [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        numbers = all(isinstance(n, ast.Constant | ast.Tuple | ast.BinOp | ast.UnaryOp | ast.Load | ast.Pow
                                 | ast.Div | ast.Mult | ast.USub | ast.Add | ast.Sub)
                      for n in ast.walk(node.value))
        if numbers and any(re.search(r"TOL|ATOL|RTOL|ULPS|BUDGET|RELDIFF|QUOTA", n) for n in names):
            bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {', '.join(names)}")
    return bad


def test_tolerances_have_one_home():
    """Every tolerance is defined in contracts/tolerances.py; a check module, the comparators or a contract file that
    defines one of its own (``ATTN_OUT_TOL = (1e-4, 1/128)``) fails here, naming the line."""
    home = ROOT / "contracts" / "tolerances.py"
    bad = [hit for package in ("contracts", "goldens", "backends") for path in sorted((ROOT / package).rglob("*.py"))
           if path != home for hit in _module_level_numbers(path)]
    assert not bad, "tolerances defined outside contracts/tolerances.py:\n" + "\n".join(bad)
    assert len(_module_level_numbers(home)) >= 25  # the check finds them at all


def test_the_tolerance_check_finds_a_stray_bound(tmp_path):
    stray = tmp_path / "contracts" / "test_x.py"
    stray.parent.mkdir()
    stray.write_text("ATTN_OUT_TOL = (1e-4, 1.0 / 128)\nNAME = 'x'\nCMP_TOL, STATE_TOL = (1e-4, 1e-2), (1e-3, 1e-3)\n")
    import tests.test_house as house

    old = house.ROOT
    house.ROOT = tmp_path
    try:
        assert [h.split(" ", 1)[1] for h in _module_level_numbers(stray)] == ["ATTN_OUT_TOL", "CMP_TOL, STATE_TOL"]
    finally:
        house.ROOT = old


def test_the_host_pool_follows_the_machine_or_pto_workers(monkeypatch):
    """No core count is written into the product: the pool is the CPUs this process may use, or PTO_WORKERS."""
    import os

    from kernels import workers

    monkeypatch.delenv("PTO_WORKERS", raising=False)
    assert workers.size() == len(os.sched_getaffinity(0))
    for given, want in (("3", 3), ("1", 1), ("0", len(os.sched_getaffinity(0))), ("x", len(os.sched_getaffinity(0)))):
        monkeypatch.setenv("PTO_WORKERS", given)
        assert workers.size() == want, given
