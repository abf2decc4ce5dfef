"""Every golden of upstream's DeepSeek-V4 model folders, and what the harness does with it: one Markdown table per
folder (``docs/upstream.md`` keeps the one of the checkout named there).

    python -m backends.upstream.folders --pypto-lib DIR [--model FOLDER ...]

Each ``models/<folder>/<module>.py`` is read with ``ast`` (nothing imported): its ``golden_*`` functions, and its
``@pl.jit`` entries. A golden is ``adapted`` (the operator whose adapter calls it, for the operator's main form or
another path or form it names, ``backends.upstream.adapters``), ``adapted inside`` an adapted golden that calls it
by name (of its own module, or one importing it from this one),
or ``not adapted yet``; a module without a golden says so. Exit 0, 2 on bad usage (no checkout, unknown folder).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

from backends.upstream.adapters import BY_FOLDER, FOLDERS


def _module_facts(path: Path) -> tuple[list[str], list[str], dict[str, set[tuple[str, str]]]]:
    """(golden functions, @pl.jit entry functions, the goldens each golden calls by name: (module, golden), its own
    module's or one it imports from another module of the folder, at module level or inside the function) of one
    model module."""
    tree = ast.parse(path.read_text())

    def imported(nodes) -> dict[str, tuple[str, str]]:
        return {a.asname or a.name: (n.module, a.name) for n in nodes if isinstance(n, ast.ImportFrom) and n.module
                for a in n.names if a.name.startswith("golden_")}

    at_top = imported(tree.body)
    goldens, entries, calls = [], [], {}
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        if node.name.startswith("golden_"):
            goldens.append(node.name)
            names = {**at_top, **imported(ast.walk(node))}
            calls[node.name] = {names.get(c.func.id, (path.stem, c.func.id)) for c in ast.walk(node)
                                if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                                and (c.func.id.startswith("golden_") or c.func.id in names)}
        if any(ast.unparse(d).startswith("pl.jit") and not ast.unparse(d).startswith("pl.jit.inline")
               for d in node.decorator_list):
            entries.append(node.name)
    return goldens, entries, calls


def folder_rows(root: Path, folder: str) -> list[tuple[str, str, str, str]]:
    """(module, golden, entries, status) for every golden of ``folder`` (a module without one: golden "-")."""
    adapted = {(a.module_of(), a.function): a.operator for a in BY_FOLDER[folder].values()}
    adapted.update({(a.module_of(m), f): a.operator for a in BY_FOLDER[folder].values() for m, f in a.forms})
    also: dict[str, str] = {}  # module -> the first operator (by name) whose adapter reads it
    for a in sorted(BY_FOLDER[folder].values(), key=lambda a: a.operator, reverse=True):
        also.update({a.module_of(m): a.operator for m in a.also})
    paths = [p for p in sorted((root / "models" / folder).glob("*.py")) if p.stem not in ("config", "utils", "__init__")]
    facts = {p.stem: _module_facts(p) for p in paths}
    callers: dict[tuple[str, str], tuple[str, str]] = {}  # (module, golden) -> an adapted golden calling it
    for module, (_, _, calls) in sorted(facts.items()):
        for caller, called in sorted(calls.items()):
            if (module, caller) in adapted:
                for key in sorted(called):
                    callers.setdefault(key, (module, caller))
    rows = []
    for path in paths:
        goldens, entries, calls = facts[path.stem]
        shown = ", ".join(entries) or "-"
        if not goldens:
            rows.append((path.stem, "-", shown, f"no golden (read by {also[path.stem]})" if path.stem in also
                         else "no golden"))
        for g in goldens:
            op = adapted.get((path.stem, g))
            caller = callers.get((path.stem, g))
            where = caller and (caller[1] if caller[0] == path.stem else f"{caller[0]}.py::{caller[1]}")
            status = f"adapted: `{op}`" if op else \
                f"adapted inside `{where}` (`{adapted[caller]}`), which calls it" if caller else \
                (f"not adapted itself (its module is read by `{also[path.stem]}`'s adapter)" if path.stem in also
                 else "not adapted yet")
            rows.append((path.stem, g, shown, status))
    return rows


def render(root: Path, folders=FOLDERS) -> str:
    out = []
    for folder in folders:
        rows = folder_rows(root, folder)
        n = sum(1 for r in rows if r[1] != "-")
        done = sum(1 for r in rows if r[3].startswith("adapted"))  # called by its adapter, or inside a golden it calls
        out += [f"### models/{folder} ({done} of {n} goldens adapted)", "",
                "| module | golden | `@pl.jit` entries | here |", "|---|---|---|---|"]
        out += [f"| {m} | {g} | {e} | {s} |" for m, g, e, s in rows]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.upstream.folders", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pypto-lib", required=True, metavar="DIR", help="a pypto-lib checkout")
    parser.add_argument("--model", action="append", choices=FOLDERS, default=None, metavar="FOLDER",
                        help="a model folder (repeatable; default every one)")
    args = parser.parse_args(argv)
    root = Path(args.pypto_lib).expanduser()
    missing = [f for f in (args.model or FOLDERS) if not (root / "models" / f).is_dir()]
    if missing:
        print(f"error: {root} has no models/{missing[0]} (a pypto-lib checkout of main)", file=sys.stderr)
        return 2
    sys.stdout.write(render(root, tuple(args.model or FOLDERS)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
