"""docs/coverage.md cannot drift: every upstream check has one row, every row has a status, a cited test is a
collected test function that calls the operator or comparator the row is about, planned rows point at an
open capability, and the header's totals are the ones computed here.

Row format: ``| ID | Where | Status | Subject | Evidence |``

- Status: ``covered``, ``ready`` (a device-only rule whose contract is built and tested on the host, never judged
  on a device output: a device row is ``covered`` only when it cites a judged device run), ``partial`` (Evidence
  says ``missing: ...``), ``planned`` (Evidence names an open capability ``#N``) or ``n/a`` (Evidence gives the
  reason).
- Subject: what the rule is about, comma-separated: operator names of ``contracts.operators.OPERATORS``
  or dotted Python names (``contracts.checks.precision.check_ratio_allclose``).
- Evidence: the tests, as ``path::test_name`` (plus notes).

A cited test exercises a subject when its code (with the module helpers and module tables it uses)
asks a backend for that operator, or names that function.
"""

from __future__ import annotations

import ast
import re
import sys
from functools import cache
from pathlib import Path

from contracts.operators import OPERATORS
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "coverage.md"
UPSTREAM = ROOT.parent / "shared" / "docs" / "upstream_checks.md"
STATUSES = ("covered", "ready", "partial", "planned", "n/a")
# a device output judged here: what lets a device-only row be "covered" rather than "ready"
DEVICE_RUN = "tests/test_goldens.py::test_the_kept_a5sim_outputs_are_judged_again_on_every_run"
# The capabilities still open (the issue tracker's open issues): a planned row must name one of them.
OPEN_CAPABILITIES: dict[int, str] = {}  # #24-#28 and #45-#49 are resolved
V4_ID = r"V4-\d{2}"  # the V4 section's own rules (no upstream_checks ID): spec §8 and the V4 sources
TEST_REF = re.compile(r"((?:contracts|tests)/[\w/]+\.py)::(\w+)")


def rows(pattern: str = r"[A-Z]{2}-\d{2}") -> list[dict]:
    """The rows whose ID matches ``pattern``: upstream_checks' IDs by default, ``V4_ID`` for the V4 section."""
    out = []
    for line in DOC.read_text().splitlines():
        m = re.match(rf"^\| ({pattern}) \|", line)
        if not m:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 5, f"{m.group(1)}: expected 5 cells (ID, Where, Status, Subject, Evidence), got {cells}"
        out.append(dict(zip(("id", "where", "status", "subject", "evidence"), cells, strict=True)))
    return out


def totals(rs: list[dict]) -> dict[str, int]:
    return {s: sum(r["status"] == s for r in rs) for s in STATUSES}


def test_every_upstream_id_has_one_row():
    ids = [r["id"] for r in rows()]
    assert len(ids) == len(set(ids)) == 238, f"{len(ids)} rows, {len(set(ids))} distinct (expected 238)"
    if UPSTREAM.exists():  # shared/ beside the checkout (developers and CI have it)
        upstream = set(re.findall(r"^\| ([A-Z]{2}-\d{2}) \|", UPSTREAM.read_text(), flags=re.M))
        assert set(ids) == upstream, f"not in upstream_checks.md: {sorted(set(ids) - upstream)}; " \
                                     f"missing here: {sorted(upstream - set(ids))}"


def test_rows_are_well_formed():
    problems = []
    for r in rows() + rows(V4_ID):
        rid, status, subject, ev = r["id"], r["status"], r["subject"], r["evidence"]
        if status not in STATUSES:
            problems.append(f"{rid}: status {status!r} not one of {STATUSES}")
            continue
        issues = {int(n) for n in re.findall(r"#(\d+)", ev)}
        closed = sorted(issues - OPEN_CAPABILITIES.keys())
        if closed:
            problems.append(f"{rid}: points at issue(s) {closed}, which are not open")
        if status == "ready" and r["where"] != "device":
            problems.append(f"{rid}: ready is for device-only rules (a host rule is covered or partial)")
        if status == "covered" and r["where"] == "device" and DEVICE_RUN not in ev:
            problems.append(f"{rid}: a device rule is covered only when a device output of it was judged (cite "
                            f"{DEVICE_RUN}); otherwise it is ready")
        if status in ("covered", "ready", "partial"):
            if not TEST_REF.search(ev):
                problems.append(f"{rid}: {status} without a cited test")
            if not subject or subject == "—":
                problems.append(f"{rid}: {status} without a subject")
        if status == "partial" and "missing:" not in ev:
            problems.append(f"{rid}: partial must say what is missing ('missing: ...')")
        if status in ("covered", "ready") and "missing:" in ev:
            problems.append(f"{rid}: covered but says something is missing")
        if status == "planned" and not issues:
            problems.append(f"{rid}: planned without an open capability (#N)")
        if status == "n/a" and len(ev) < 20:
            problems.append(f"{rid}: n/a needs a reason")
    assert not problems, "\n".join(problems)


@cache
def collected() -> frozenset[str]:
    """``path::name`` of every test function pytest collects in contracts/ and tests/ (parameters stripped): this
    session's own collection where it was that whole collection (tests/conftest.py), else a ``--collect-only``."""
    from tests import conftest

    if conftest.WHOLE_COLLECTION is not None:
        return conftest.WHOLE_COLLECTION
    proc = forkserver.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
                           "-p", "no:randomly", "contracts", "tests"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return frozenset(line.split("[")[0] for line in proc.stdout.splitlines() if "::" in line)


@cache
def _module(path: str) -> ast.Module:
    return ast.parse((ROOT / path).read_text())


def _code_of(path: str, name: str) -> list[ast.AST]:
    """The test function plus the module functions and module-level tables it reaches by name."""
    tree = _module(path)
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    tables = {}
    for n in tree.body:
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    tables[t.id] = n
    seen, todo, out = set(), [name], []
    while todo:
        cur = todo.pop()
        if cur in seen:
            continue
        seen.add(cur)
        node = defs.get(cur) or tables.get(cur)
        if node is None:
            continue
        out.append(node)
        if cur in tables:  # module-level statements that fill the table (e.g. ``TABLE[key] = ...`` in a loop)
            fills = [s for s in tree.body if not isinstance(s, ast.FunctionDef | ast.ClassDef | ast.Import |
                                                            ast.ImportFrom)
                     and s is not node and any(isinstance(n, ast.Name) and n.id == cur for n in ast.walk(s))]
            out += fills
            todo += [n.id for f in fills for n in ast.walk(f) if isinstance(n, ast.Name) and n.id in defs]
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and (n.id in defs or n.id in tables):
                todo.append(n.id)
    return out


def exercises(path: str, name: str, subject: str) -> bool:
    code = _code_of(path, name)
    strings = {n.value for c in code for n in ast.walk(c) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    names = {n.id for c in code for n in ast.walk(c) if isinstance(n, ast.Name)} | \
            {n.attr for c in code for n in ast.walk(c) if isinstance(n, ast.Attribute)}
    if subject in OPERATORS:
        return subject in strings
    return subject.rsplit(".", 1)[-1] in names


def test_cited_tests_are_collected_and_exercise_the_subject():
    found = collected()
    problems = []
    for r in rows() + rows(V4_ID):
        if r["status"] not in ("covered", "ready", "partial"):
            continue
        subjects = [s.strip() for s in r["subject"].split(",") if s.strip()]
        for path, name in TEST_REF.findall(r["evidence"]):
            if f"{path}::{name}" not in found:
                problems.append(f"{r['id']}: {path}::{name} is not a collected test")
                continue
            if not any(exercises(path, name, s) for s in subjects):
                problems.append(f"{r['id']}: {path}::{name} calls none of {subjects}")
    assert not problems, "\n".join(problems)


def test_header_totals_are_computed():
    rs = rows()
    t = totals(rs)
    host = [r for r in rs if r["where"].startswith("host") or "test host" in r["where"] or "tests host" in r["where"]]
    th = totals(host)
    want = (f"Totals (computed by tests/test_coverage_doc.py): {len(rs)} rows; covered {t['covered']}, "
            f"ready {t['ready']}, partial {t['partial']}, planned {t['planned']}, n/a {t['n/a']}. Host-runnable rows: "
            f"{len(host)}; covered {th['covered']}, partial {th['partial']}, planned {th['planned']}, n/a {th['n/a']}.")
    header = next((line for line in DOC.read_text().splitlines() if line.startswith("Totals (computed")), None)
    assert header == want, f"docs/coverage.md header is\n  {header}\nbut the rows give\n  {want}"
    v4 = rows(V4_ID)
    t4 = totals(v4)
    want4 = (f"V4 totals (computed by tests/test_coverage_doc.py): {len(v4)} rows; covered {t4['covered']}, "
             f"ready {t4['ready']}, partial {t4['partial']}, planned {t4['planned']}, n/a {t4['n/a']}.")
    line4 = next((line for line in DOC.read_text().splitlines() if line.startswith("V4 totals (computed")), None)
    assert line4 == want4, f"docs/coverage.md V4 header is\n  {line4}\nbut the rows give\n  {want4}"



CATEGORY = {"SC": "schedule / config", "MD": "metadata", "CQ": "cache layout / quantization",
            "CS": "compressor state", "RR": "RoPE rows", "IX": "indexer / Top-K", "AP": "attention precision",
            "SP": "SP / wiring", "HC": "mHC", "MO": "MoE", "RP": "replay / save", "CH": "CLI / harness", "V4": "V4"}


def outline() -> list[str]:
    """The table at the top of the file: per category, its rows by status, with a link to its section."""
    out = ["| Category | Rows | covered | ready | partial | planned | n/a |", "|---|---|---|---|---|---|---|"]
    every = rows() + rows(V4_ID)
    for prefix, title in CATEGORY.items():
        rs = [r for r in every if r["id"].startswith(prefix + "-")]
        t = totals(rs)
        out.append(f"| {prefix} {title} | {len(rs)} | " + " | ".join(str(t[s]) for s in STATUSES) + " |")
    return out


def test_the_outline_is_computed():
    text = DOC.read_text().splitlines()
    want = outline()
    start = next((i for i, line in enumerate(text) if line == want[0]), None)
    assert start is not None, "docs/coverage.md has no outline table (tests.test_coverage_doc.outline())"
    got = text[start:start + len(want)]
    assert got == want, "docs/coverage.md outline is\n  " + "\n  ".join(got) + "\nbut the rows give\n  " + \
        "\n  ".join(want)


def test_this_sessions_collection_stands_in_only_when_it_was_the_whole_of_contracts_and_tests(monkeypatch):
    """tests/conftest.py keeps a session's collection for ``collected()`` only when it collected contracts/ and
    tests/ whole: not for a file, a node id, one of the two folders, ``--deselect``, ``--ignore`` or ``--lf``."""
    from types import SimpleNamespace

    from tests import conftest

    monkeypatch.setattr(conftest, "WHOLE_COLLECTION", conftest.WHOLE_COLLECTION)  # restored afterwards
    items = [SimpleNamespace(nodeid="tests/test_a.py::test_b[1]"), SimpleNamespace(nodeid="contracts/test_c.py::test_d")]
    both = [str(ROOT / "tests"), str(ROOT / "contracts")]
    cases = [(both, {}, True), ([str(ROOT)], {}, True), ([str(ROOT / "tests")], {}, False),
             ([str(ROOT / "tests" / "test_house.py"), str(ROOT / "contracts")], {}, False),
             ([f"{ROOT / 'tests'}::x", str(ROOT / "contracts")], {}, False),
             (both, {"deselect": ["tests/test_a.py::test_b"]}, False), (both, {"ignore": ["tests/x"]}, False),
             (both, {"lf": True}, False)]
    for args, options, whole in cases:
        config = SimpleNamespace(args=args, getoption=lambda name, default=None, o=options: o.get(name, default))
        wrapper = conftest.pytest_collection_modifyitems(None, config, items)
        next(wrapper)
        kept = conftest.WHOLE_COLLECTION
        assert (kept is not None) == whole, (args, options, kept)
        if whole:
            assert kept == {"tests/test_a.py::test_b", "contracts/test_c.py::test_d"}, kept


def test_every_covered_row_names_an_edit_its_tests_catch():
    """#47 item 4: a covered row names the edit of the reference its cited tests catch -- a seeded defect declared
    for one of them (run by tests/test_seeded_defects.py), or an entry of tests.mutation.rows.EDITS whose old text
    occurs once where it says (run on demand: python -m tests.mutation.rows)."""
    from tests.mutation.rows import problems

    bad = problems()
    assert not bad, "\n".join(bad)
