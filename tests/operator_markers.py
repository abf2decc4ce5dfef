"""What each contract test calls, read from its code, beside what it declares with ``@pytest.mark.operators``.

``pytest contracts/ --operator NAME`` selects by the declared markers (pto_pytest.plugin); this module is the
static half of keeping them true (the plugin checks the other half at run time: an operator a test asks the
backend for and did not declare fails the test). A test calls an operator when its code, or a module-level helper
it calls, names it as a string argument (``op(backend, "X")``, ``both("X", backend, ...)``, ``b.get("X")``) or
calls the reference function of that name (operator names are their reference functions' names). A test whose
operator is computed (``op(backend, name)``) declares it per parameter: ``pytest.param(..., marks=...)``.

    python -m tests.operator_markers            # every test whose declaration differs, with the line to write
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from contracts.operators import OPERATORS

ROOT = Path(__file__).resolve().parents[1]


def _walk_body(fn: ast.FunctionDef):
    """The nodes of a function's body: its decorators (the declaration itself) are not what it calls."""
    for stmt in fn.body:
        yield from ast.walk(stmt)


def _called(node: ast.FunctionDef) -> tuple[set[str], bool]:
    """(operators named or called in ``node``'s body, whether it asks for an operator by a computed name)."""
    out, computed = set(), False
    for n in _walk_body(node):
        if not isinstance(n, ast.Call):
            continue
        for a in n.args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value in OPERATORS:
                out.add(a.value)
        func = n.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name in OPERATORS and not (isinstance(func, ast.Attribute) and func.attr == "get"):
            out.add(name)
        if name == "op" and len(n.args) == 2 and not isinstance(n.args[1], ast.Constant):
            computed = True
    return out, computed


def _marks(decorators: list[ast.expr]) -> tuple[set[str], set[str], bool]:
    """(operators of ``@pytest.mark.operators(...)``, operators of per-parameter marks, any per-param mark)."""
    fixed, per_param, has_params = set(), set(), False
    for d in decorators:
        if not isinstance(d, ast.Call):
            continue
        text = ast.unparse(d.func)
        if text.endswith("mark.parametrize") and any(isinstance(n, ast.Call) and ast.unparse(n.func).endswith(
                "operator_params") for n in ast.walk(d)):
            has_params = True  # declared per parameter from a table (pto_pytest.plugin.operator_params)
        elif text.endswith("mark.operators"):
            fixed |= {a.value for a in d.args if isinstance(a, ast.Constant)}
        elif text.endswith("mark.parametrize"):
            for n in ast.walk(d):
                if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("mark.operators"):
                    has_params = True
                    per_param |= {a.value for a in n.args if isinstance(a, ast.Constant)}
    return fixed, per_param, has_params


def _module_marks(tree: ast.Module) -> set[str]:
    out = set()
    for n in tree.body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets):
            for c in ast.walk(n.value):
                if isinstance(c, ast.Call) and ast.unparse(c.func).endswith("mark.operators"):
                    out |= {a.value for a in c.args if isinstance(a, ast.Constant)}
    return out


@dataclass(frozen=True)
class TestOperators:
    module: str
    name: str
    line: int
    calls: frozenset[str]  # read from the code (with helpers); with ``computed``, the names the module offers
    computed: bool  # asks for an operator by a computed name: declared per parameter
    declared: frozenset[str]  # module marker + function marker + per-parameter markers
    per_param: bool

    def problem(self) -> str | None:
        if self.computed and not self.per_param and self.calls:
            return "asks for an operator by a computed name: declare it per parameter (pytest.param(..., marks=...))"
        if self.per_param:
            extra = self.declared - self.calls
            return f"declares {sorted(extra)}, which its code never names" if extra else None
        if self.declared != self.calls:
            want = ", ".join(f'"{o}"' for o in sorted(self.calls))
            return (f"declares {sorted(self.declared)}, its code calls {sorted(self.calls)}: "
                    f"@pytest.mark.operators({want})" if self.calls else "declares operators it never calls")
        return None


@cache
def contract_tests() -> tuple[TestOperators, ...]:
    rows = []
    for path in sorted((ROOT / "contracts").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_marked = _module_marks(tree)
        module_named = frozenset(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                                 and isinstance(n.value, str) and n.value in OPERATORS)
        helpers = {n.name: _called(n) for n in tree.body if isinstance(n, ast.FunctionDef)
                   and not n.name.startswith("test_")}
        for n in tree.body:
            if not (isinstance(n, ast.FunctionDef) and n.name.startswith("test_")):
                continue
            calls, computed = _called(n)
            written = {x.value for x in _walk_body(n) if isinstance(x, ast.Constant) and x.value in OPERATORS}
            if computed and written:  # a loop over names written in the test: those names
                calls, computed = calls | written, False
            seen, todo = set(), [c.func.id for c in _walk_body(n) if isinstance(c, ast.Call)
                                 and isinstance(c.func, ast.Name) and c.func.id in helpers]
            while todo:  # helpers calling helpers
                h = todo.pop()
                if h in seen:
                    continue
                seen.add(h)
                calls |= helpers[h][0]  # a helper taking the name as an argument: its callers name it
                todo += [c.func.id for c in _walk_body(next(x for x in tree.body if getattr(x, "name", None) == h))
                         if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in helpers]
            if computed:
                calls |= module_named
            fixed, per_param, has_params = _marks(n.decorator_list)
            rows.append(TestOperators(f"contracts.{path.stem}", n.name, n.lineno, frozenset(calls), computed,
                                      frozenset(module_marked | fixed | per_param), has_params))
    return tuple(rows)


def main() -> int:
    bad = [(t, p) for t in contract_tests() if (p := t.problem())]
    for t, p in bad:
        print(f"contracts/{t.module.split('.')[-1]}.py:{t.line}: {t.name} {p}")
    print(f"{len(bad)} of {len(contract_tests())} contract tests declare other operators than they call")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
