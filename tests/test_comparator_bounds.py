"""Tolerances live once: each check module exports the bounds of the comparators built on it, the comparator
table is checked against them, and what a tree record stores is derived from them."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from contracts import compare
from contracts.result import Bound, bounds_by_name

ROOT = Path(__file__).resolve().parents[1]


def test_every_comparator_has_a_bound_and_every_bound_a_comparator():
    missing = sorted(set(compare.COMPARATORS) - set(compare.BOUNDS))
    orphan = sorted(set(compare.BOUNDS) - set(compare.COMPARATORS))
    assert not missing, f"comparators without a bound: {missing}"
    assert not orphan, f"bounds without a comparator: {orphan}"


def test_a_bound_is_numbers_and_a_rule():
    for name, b in compare.BOUNDS.items():
        assert b.comparator == name and b.rule, name
        for key, value in b.values.items():
            assert isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value), \
                f"{name}.{key} = {value!r}"


def test_tree_tolerances_are_the_bounds():
    assert {name: dict(b.values) for name, b in compare.BOUNDS.items()} == compare.TOLERANCES


def test_a_comparator_declared_twice_is_refused():
    with pytest.raises(ValueError, match="declared twice"):
        bounds_by_name([Bound("exact", "a")], [Bound("exact", "b")])


def test_compare_py_writes_no_tolerance_literal():
    """No float literal in compare.py outside a function body's arithmetic helpers: the numbers are the check
    modules' (a literal tolerance table here is what this test exists to stop)."""
    tree = ast.parse((ROOT / "contracts" / "compare.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            floats = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, float)]
            assert not floats, f"compare.py line {node.lineno}: module-level number(s) {floats}"
