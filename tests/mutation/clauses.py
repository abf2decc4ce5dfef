"""Drop each failure clause of the comparators that are not backend operators, and show a test fails.

    .venv/bin/python -m tests.mutation.clauses                  # every clause, 2 workers (about 10 min)
    .venv/bin/python -m tests.mutation.clauses --only 'contracts.checks.topk:*' --verbose
    .venv/bin/python -m tests.mutation.clauses --list           # the clauses and the tests chosen for each

``tests.mutation.run`` mutates the operator modules (kernels.*, contracts.checks.precision) through a shadow
backend. The rest of the check library (cache, topk, moe, metadata, attention, teacher) is imported by the
tests directly, so a mutant cannot be slipped in through a backend. Here each one is run in a shadow copy of
the source tree instead: one ``if`` whose body reports a failure (``return failed(..)``, ``t.fail(..)``) has
its condition replaced by ``False`` (a ``tally.expect(..)`` clause is removed), and the tests that reach the enclosing function (by name, through the
module's own callers), with the seeded-defect cases of tests/test_seeded_defects.py that run those tests, run
with ``-x`` in a fresh pytest process.

A clause whose drop no test notices is a clause no test shows failing on its own (issue #26 item 2): with it
gone every test still gets the verdict it asserts. Every survivor is printed with its location; exit code 0
when every clause is killed, 1 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("contracts.checks.cache", "contracts.checks.topk", "contracts.checks.moe", "contracts.checks.metadata",
           "contracts.checks.attention", "contracts.checks.teacher", "contracts.compare")
TEST_DIRS = ("contracts", "tests")
def _packages() -> tuple[str, ...]:
    """The project's packages as pyproject.toml lists them (``contracts*`` -> ``contracts``): a package added there
    is copied into the shadow tree without editing this file."""
    import tomllib

    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    return tuple(name.rstrip("*") for name in found["include"])


COPY = (*_packages(), "tests", "docs", "conftest.py", "pyproject.toml")


# Clauses whose drop changes no verdict on any input, each with why (keyed by module:function and the clause's
# source as --list prints it, which survives line moves). Reported as equivalent, not as survivors.
EQUIVALENT = {
    ("contracts.checks.metadata:check_query_layout", "t.expect('query_start_loc', (0,), qsl[0], 0)"):
        "subsumed: the expect before it compares the whole query_start_loc with the inputs' (which starts at 0); "
        "it stays for the message, which names index 0",
    ("contracts.checks.metadata:check_query_layout", "if qsl[r] < qsl[r - 1]"):
        "subsumed: the whole-list expect fails every decreasing query_start_loc (the inputs' never decreases); it "
        "stays for the message, which names the decreasing index",
    ("contracts.checks.metadata:check_positions", "t.expect('position_ids', (tok,), pos[tok] - pos[tok - 1], 1, note='..."):
        "implied: every active position equal to kv_seq_len + offset (the expect before it) makes each chunk "
        "consecutive; it stays for the message, which says 'consecutive within a chunk'",
}


@dataclass(frozen=True)
class Clause:
    module: str
    func: str
    line: int
    source: str  # the condition, shortened

    @property
    def key(self) -> str:
        return f"{self.module}:{self.func}:{self.line}"


def _path(module: str, root: Path = ROOT) -> Path:
    return root / (module.replace(".", "/") + ".py")


def _reports_failure(stmts: list[ast.stmt]) -> bool:
    for s in stmts:
        for n in ast.walk(s):
            if isinstance(n, ast.Call):
                f = n.func
                if isinstance(f, ast.Name) and f.id == "failed" or isinstance(f, ast.Attribute) and f.attr == "fail":
                    return True
    return False


def clauses_of(module: str) -> list[Clause]:
    tree = ast.parse(_path(module).read_text())
    out = []
    for top in tree.body:
        if not isinstance(top, ast.FunctionDef):
            continue
        for n in ast.walk(top):
            if isinstance(n, ast.If) and _reports_failure(n.body):
                text = "if " + ast.unparse(n.test)
            elif _is_expect(n):
                text = ast.unparse(n)
            else:
                continue
            out.append(Clause(module, top.name, n.lineno, text if len(text) < 70 else text[:67] + "..."))
    return out


def _is_expect(n: ast.AST) -> bool:
    """A ``tally.expect(field, index, got, want)`` statement: a clause that fails when got != want."""
    return isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute) \
        and n.value.func.attr == "expect"


def mutated(clause: Clause) -> str:
    """The module with the clause dropped: an ``if`` that reports a failure never taken, an ``expect`` removed."""
    tree = ast.parse(_path(clause.module).read_text())
    for n in ast.walk(tree):
        if isinstance(n, ast.If) and n.lineno == clause.line and _reports_failure(n.body):
            n.test = ast.Constant(False)
            return ast.unparse(tree)
        if _is_expect(n) and n.lineno == clause.line:
            n.value = ast.Constant(None)
            return ast.unparse(tree)
    raise LookupError(clause.key)


def _callers(module: str, func: str) -> set[str]:
    """``func`` and every function (or module-level table) of the module that reaches it through the module's
    own functions and tables."""
    tree = ast.parse(_path(module).read_text())
    uses = {n.name: {m.id for m in ast.walk(n) if isinstance(m, ast.Name)}
            for n in tree.body if isinstance(n, ast.FunctionDef)}
    for n in tree.body:  # a module-level table of checks (ALL_CHECKS = (...)) reaches what it lists
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        if len(targets) == 1 and isinstance(targets[0], ast.Name) and n.value is not None:
            uses.setdefault(targets[0].id, set()).update(m.id for m in ast.walk(n.value) if isinstance(m, ast.Name))
    reach, todo = {func}, [func]
    while todo:
        f = todo.pop()
        for g, names in uses.items():
            if f in names and g not in reach:
                reach.add(g)
                todo.append(g)
    return reach


def _test_index() -> dict[str, set[str]]:
    """{pytest node id: names the test reaches, through the helpers of its own file, one level deep}."""
    index = {}
    for d in TEST_DIRS:
        for path in sorted((ROOT / d).glob("test_*.py")):
            tree = ast.parse(path.read_text())
            helpers = {n.name: {m.id for m in ast.walk(n) if isinstance(m, ast.Name)} |
                       {m.attr for m in ast.walk(n) if isinstance(m, ast.Attribute)}
                       for n in tree.body if isinstance(n, ast.FunctionDef)}
            for n in tree.body:
                if isinstance(n, ast.FunctionDef) and n.name.startswith("test"):
                    names = set(helpers[n.name])
                    for h in list(names):
                        if h in helpers and h != n.name:
                            names |= helpers[h]
                    index[f"{d}/{path.name}::{n.name}"] = names
    return index


def _seeded_defect_cases() -> dict[str, list[str]]:
    """{contract test name: the tests/test_seeded_defects.py cases that run it against a seeded defect}: a clause
    a contract needs to catch its seeded defect is killed there, not by the contract run on the reference."""
    from tests.test_seeded_defects import DECLARED

    out: dict[str, list[str]] = {}
    for _module, d in DECLARED:
        out.setdefault(d.test, []).append(f"tests/test_seeded_defects.py::test_contract_file_catches_its_declared_defect"
                                          f"[{d.name}->{d.test}]")
    return out


def tests_for(clause: Clause, index: dict[str, set[str]], seeded: dict[str, list[str]] | None = None) -> list[str]:
    reach = _callers(clause.module, clause.func)
    direct = sorted(t for t, names in index.items() if names & reach)
    extra = [case for t in direct for case in (seeded or {}).get(t.split("::")[1], [])]
    return direct + sorted(set(extra))


def _shadow() -> Path:
    d = Path(tempfile.mkdtemp(prefix="pto-clauses-"))
    for name in COPY:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, d / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
        else:
            shutil.copy2(src, d / name)
    (d / "artifacts").symlink_to(ROOT / "artifacts")
    return d


def run_edited(target: Path, text: str, tests: list[str], shadow: Path, timeout: float) -> tuple[str, str]:
    """Run ``tests`` (``-x``, the ``ci`` hypothesis profile) in the shadow tree with ``target`` holding ``text``,
    then put the file back: ("killed", the first failing test) / ("killed (timeout)", "") / ("survived", "") /
    ("error", pytest's last line)."""
    original = target.read_text()
    target.write_text(text)
    try:
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", HYPOTHESIS_PROFILE="ci")
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *tests]
        try:
            proc = subprocess.run(cmd, cwd=shadow, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "killed (timeout)", ""
        if proc.returncode == 0:
            return "survived", ""
        if proc.returncode == 1:
            failed = [line.split(" ", 1)[1].split(" - ")[0] for line in proc.stdout.splitlines()
                      if line.startswith("FAILED ")]
            return "killed", failed[0] if failed else "(a test failed)"
        tail = (proc.stdout + proc.stderr).strip().splitlines()
        return "error", tail[-1] if tail else f"pytest exit {proc.returncode}"
    finally:
        target.write_text(original)


def _run(clause: Clause, tests: list[str], shadow: Path, timeout: float) -> tuple[str, str]:
    return run_edited(_path(clause.module, shadow), mutated(clause), tests, shadow, timeout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.mutation.clauses", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", action="append", metavar="GLOB", help="clauses whose key module:func:line matches")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (default 2)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per clause before it counts as killed")
    p.add_argument("--list", action="store_true", help="list the clauses and the tests chosen for each, and exit")
    p.add_argument("--verbose", "-v", action="store_true", help="the test that killed each clause")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    index, seeded = _test_index(), _seeded_defect_cases()
    work = [(c, tests_for(c, index, seeded)) for m in MODULES for c in clauses_of(m)
            if not args.only or any(fnmatch.fnmatch(c.key, g) for g in args.only)]
    if not work:
        print("no clause matches --only", file=sys.stderr)
        return 2
    if args.list:
        for c, tests in work:
            print(f"{c.key}  {c.source}  <- {len(tests)} tests")
        return 0
    shadows = [_shadow() for _ in range(args.jobs)]
    start = time.monotonic()
    results: dict[str, tuple[str, str]] = {}
    try:
        def job(i: int):
            shadow = shadows[i % len(shadows)]
            for k in range(i, len(work), len(shadows)):
                c, tests = work[k]
                results[c.key] = _run(c, tests, shadow, args.timeout) if tests else ("survived", "no test reaches it")
        with ThreadPoolExecutor(len(shadows)) as pool:
            list(pool.map(job, range(len(shadows))))
    finally:
        for s in shadows:
            shutil.rmtree(s, ignore_errors=True)
    for c, _ in work:
        if results[c.key][0] == "survived" and (f"{c.module}:{c.func}", c.source) in EQUIVALENT:
            results[c.key] = ("equivalent", EQUIVALENT[(f"{c.module}:{c.func}", c.source)])
    equivalent = sum(1 for c, _ in work if results[c.key][0] == "equivalent")
    killed = sum(1 for c, _ in work if results[c.key][0].startswith("killed"))
    errors = [c for c, _ in work if results[c.key][0] == "error"]
    survivors = [c for c, _ in work if results[c.key][0] == "survived"]
    for c, _ in work:
        outcome, detail = results[c.key]
        if args.verbose or outcome not in ("killed", "equivalent"):
            print(f"{outcome:16} {c.key}  {c.source}  {detail}")
    print(f"{killed}/{len(work) - equivalent} non-equivalent clauses killed ({equivalent} equivalent, "
          f"tests.mutation.clauses.EQUIVALENT), {len(survivors)} survived, {len(errors)} errors "
          f"({time.monotonic() - start:.0f} s, {len(shadows)} workers)")
    return 0 if not survivors and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
