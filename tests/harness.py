"""Run contract tests outside pytest against any backend: the seeded-defect suite and the mutation
runner share it.

A contract is a test function of ``contracts/`` that takes a ``backend`` argument. ``run_contract``
expands its explicit ``parametrize`` sets, runs its hypothesis examples without shrinking (only
*whether* it fails matters here) and reports the first failure or crash. ``contracts_for`` finds the
contracts that call a given set of operators, by reading each test's code for ``op(backend, "NAME")``.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from hypothesis import Phase, settings

from contracts.operators import OPERATORS

ROOT = Path(__file__).resolve().parents[1]


def flatten(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [e for sub in exc.exceptions for e in flatten(sub)]
    return [exc]


def parametrized_args(fn) -> list[dict]:
    """Explicit parametrize sets of a contract test (the cross product of its marks), else one empty set."""
    sets = [{}]
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names = [n.strip() for n in mark.args[0].split(",")] if isinstance(mark.args[0], str) else list(mark.args[0])
        new = []
        for base in sets:
            for values in mark.args[1]:
                if hasattr(values, "marks") and hasattr(values, "values"):  # pytest.param(...)
                    values = values.values
                elif len(names) == 1:
                    values = (values,)
                new.append({**base, **dict(zip(names, values, strict=True))})
        sets = new
    return sets


@contextmanager
def falsify_without_shrinking(fn):
    """Run ``fn`` with its own examples, derandomized (a seeded defect is caught, or not, the same way on
    every run), and stop at the first failure (no shrinking). Hypothesis snapshots
    settings onto a @given test when it is decorated, so the override goes on that attribute and is
    restored afterwards; a plain test runs unchanged."""
    attr = "_hypothesis_internal_use_settings"
    old = getattr(fn, attr, None)
    if old is not None:
        setattr(fn, attr, settings(old, phases=[Phase.explicit, Phase.reuse, Phase.generate],
                                   report_multiple_bugs=False, database=None, derandomize=True))
    try:
        yield
    finally:
        if old is not None:
            setattr(fn, attr, old)


@dataclass(frozen=True)
class Outcome:
    """``failed``: an assertion (the contract caught it); ``crashed``: any other exception; else passed."""

    contract: str
    failures: tuple[BaseException, ...] = ()
    crashes: tuple[BaseException, ...] = ()
    skipped: str | None = None

    @property
    def passed(self) -> bool:
        return not self.failures and not self.crashes and self.skipped is None

    def text(self) -> str:
        return " | ".join(f"{type(e).__name__}: {e}" for e in (*self.failures, *self.crashes))


def run_contract(fn, backend, *, stop_at_first: bool = False) -> Outcome:
    name = f"{fn.__module__.split('.')[-1]}::{fn.__name__}"
    failures, crashes = [], []
    for kwargs in parametrized_args(fn):
        try:
            with falsify_without_shrinking(fn):
                fn(backend=backend, **kwargs)
        except pytest.skip.Exception as exc:  # only a backend without the operator skips (pto_pytest.plugin.op)
            return Outcome(name, skipped=str(exc))
        except BaseException as exc:  # AssertionError, pytest.fail's Failed, a hypothesis group, a crash
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            for e in flatten(exc):
                (failures if isinstance(e, AssertionError | pytest.fail.Exception) else crashes).append(e)
            if stop_at_first:
                break
    return Outcome(name, tuple(failures), tuple(crashes))


def _operators_called(node: ast.AST, module_names: frozenset[str] = frozenset()) -> set[str]:
    """Operator names a test's code asks a backend for: any call with an operator name as a string argument
    (``op(backend, "X")``, ``backend.get("X")``, ``both("X", backend, ...)``); where the name is computed
    (``op(backend, name)``), every operator named anywhere in the module (``module_names``)."""
    out = set()
    # the body only: a test's @pytest.mark.operators(...) declaration (tests/operator_markers.py) is not a call
    nodes = [x for stmt in node.body for x in ast.walk(stmt)] if isinstance(node, ast.FunctionDef) else ast.walk(node)
    for n in nodes:
        if not isinstance(n, ast.Call):
            continue
        for a in n.args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value in OPERATORS:
                out.add(a.value)
        if isinstance(n.func, ast.Name) and n.func.id == "op" and len(n.args) == 2 \
                and not isinstance(n.args[1], ast.Constant):
            out |= module_names
    return out


@cache
def contract_index() -> tuple[tuple[str, str, frozenset[str]], ...]:
    """(module, test name, operators it calls, including through module helpers) for every contract."""
    rows = []
    for path in sorted((ROOT / "contracts").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        named = frozenset(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in OPERATORS)
        # helpers contribute the operators they name; a helper taking the name as an argument contributes none
        helpers = {n.name: _operators_called(n) for n in tree.body if isinstance(n, ast.FunctionDef)}
        for n in tree.body:
            if not (isinstance(n, ast.FunctionDef) and n.name.startswith("test_")):
                continue
            if "backend" not in [a.arg for a in n.args.args]:
                continue
            ops = set(_operators_called(n, named))
            called = {c.func.id for c in ast.walk(n) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
            for h in called & helpers.keys():
                ops |= helpers[h]
            rows.append((f"contracts.{path.stem}", n.name, frozenset(ops)))
    return tuple(rows)


def contracts_for(operators: Iterable[str], *, exclude_modules: Iterable[str] = ("contracts.test_golden_replay",)):
    """Contract test functions that call any of ``operators`` (the golden replay is run separately)."""
    wanted, skip = set(operators), set(exclude_modules)
    out = []
    # the differential contracts first: they compare with the reference, so a wrong rule fails there fastest
    index = sorted(contract_index(), key=lambda row: row[0] != "contracts.test_differential")
    for module, name, ops in index:
        if module in skip or not (ops & wanted):
            continue
        out.append(getattr(importlib.import_module(module), name))
    return out
