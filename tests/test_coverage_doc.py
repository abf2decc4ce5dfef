"""docs/coverage.md names only tests that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_named_test_exists():
    text = (ROOT / "docs" / "coverage.md").read_text()
    refs = set(re.findall(r"((?:contracts|tests)/[\w/]+\.py)::(\w+)", text))
    assert refs, "coverage.md names no tests"
    missing = []
    for path, name in sorted(refs):
        file = ROOT / path
        defined = {n.name for n in ast.walk(ast.parse(file.read_text())) if isinstance(n, ast.FunctionDef)} \
            if file.exists() else set()
        if name not in defined:
            missing.append(f"{path}::{name}")
    assert not missing, f"coverage.md names tests that do not exist: {missing}"


def test_every_upstream_id_has_one_row():
    text = (ROOT / "docs" / "coverage.md").read_text()
    ids = re.findall(r"^\| ([A-Z]{2}-\d{2}) \|", text, flags=re.M)
    assert len(ids) == len(set(ids)) == 238, f"{len(ids)} rows, {len(set(ids))} distinct (expected 238)"
