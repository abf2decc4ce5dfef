"""Run operator-level mutants against the contracts and report the kill rate and the survivors.

    .venv/bin/python -m tests.mutation.run                      # every mutant, 2 workers (well over an hour)
    .venv/bin/python -m tests.mutation.run --module kernels.quant --jobs 2
    .venv/bin/python -m tests.mutation.run --only 'kernels.quant:_quantize_rows:*' --verbose
    .venv/bin/python -m tests.mutation.run --list                # the mutants, without running them
    .venv/bin/python -m tests.mutation.run --skip-equivalent     # not the 505 listed equivalent ones (under 10 min
                                                                  # with tests/mutation/history.json, 28 without)

For each mutant: load a shadow copy of the mutated module (and of the operator modules that import
it), build the torch backend with those operators replaced, and run, under the hypothesis ``ci``
profile, every contract of ``contracts/`` that calls one of the replaced operators, stopping at the
first failure. A mutant that survives them is then replayed against every tree of the golden store
(``--store``, default artifacts/store) whose case uses a replaced operator. So the report gives the
kill rate *without* the golden replay (contracts alone) and *with* it.

A mutant is killed when a contract fails, or when it crashes or times out under a contract (a
crash is a failing test in pytest too; the report counts crashes separately). Survivors listed in
``tests/mutation/equivalent.py`` are reported as equivalent, with the reason given there; any other
survivor is printed with its location. Exit code: 0 when every non-equivalent mutant is killed by the
contracts alone, 1 otherwise, 2 on a usage error.

Scope: the modules that implement backend operators (``engine.MODULES``: kernels.* and
contracts.checks.precision, whose comparators are operators). The check library that is not an
operator (contracts/checks/cache.py, topk.py, compare.py) is tested clause by clause in
contracts/test_comparators.py but not mutated here.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class _Timeout(Exception):
    pass


def _alarm(_signum, _frame):
    raise _Timeout("mutant timed out")


def _replay_trees(store_path: str):
    from goldens import trees
    from goldens.cases import get_case
    from goldens.store import GoldenStore

    store = GoldenStore(Path(store_path))
    if not store.exists():
        return []
    reader = store.reader()
    out = []
    for case in trees.recorded_cases(reader):
        ops = set(get_case(case).operator.split("+"))
        for wiring in trees.recorded_wirings(reader, case):
            out.append((case, wiring, ops, trees.load_tree(reader, case, wiring)))
    return out


def first_killer_first(fns: list, killer: str | None) -> list:
    """``fns`` with the contract that killed this mutant last time (``history``) moved to the front: the
    verdict is the same (a mutant is killed when any contract fails), it only comes sooner."""
    if not killer:
        return fns
    name = lambda fn: f"{fn.__module__.split('.')[-1]}::{fn.__name__}"  # noqa: E731 (Outcome.contract's form)
    return sorted(fns, key=lambda fn: name(fn) != killer)


def load_history(path: Path) -> dict[str, str]:
    """mutant key -> the contract that killed it in an earlier run (``--history``); {} when absent or unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(data, dict) else {}


def save_history(path: Path, rows: list[dict]) -> None:
    known = load_history(path)
    for r in rows:
        if r.get("status") == "killed" and "::" in r.get("by", ""):
            known[r["key"]] = r["by"]
        elif r.get("status") in ("survived", "replay"):
            known.pop(r["key"], None)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(sorted(known.items())), indent=0) + "\n")
    os.replace(tmp, path)


def run_one(mutant, store_trees, timeout: float, killer: str | None = None) -> dict:
    from goldens import trees
    from tests.harness import contracts_for, run_contract
    from tests.mutation import engine

    row = {"key": mutant.key, "where": mutant.where, "module": mutant.module}
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    loaded = {}
    try:
        try:
            loaded = engine.load_shadow(mutant)
        except _Timeout:
            raise
        except Exception as exc:
            row.update(status="killed", by="load", how="crash", detail=f"{type(exc).__name__}: {exc}"[:300])
            return row
        backend = engine.shadow_backend(loaded, f"mutant:{mutant.key}")
        ops = engine.operators_of(loaded)
        row["operators"] = sorted(ops)
        for fn in first_killer_first(contracts_for(ops), killer):
            outcome = run_contract(fn, backend, stop_at_first=True)
            if outcome.skipped is not None:  # a shadow backend has every operator: a skip judged nothing
                row.setdefault("skipped", []).append(outcome.contract)
            if outcome.failures or outcome.crashes:
                how = "fail" if outcome.failures else "crash"
                row.update(status="killed", by=outcome.contract, how=how, detail=outcome.text()[:300])
                return row
        for case, wiring, case_ops, tree in store_trees:
            if not case_ops & ops:
                continue
            try:
                results = trees.replay(tree, backend, allow_stale=True)
                bad = [f"{k}: {r.message()}" for k, r in results.items() if not r.ok]
            except _Timeout:
                raise
            except Exception as exc:
                bad = [f"{type(exc).__name__}: {exc}"]
            if bad:
                row.update(status="replay", by=f"golden {case}/{wiring}", how="fail", detail=bad[0][:300])
                return row
        row.update(status="survived")
        return row
    except _Timeout:
        row.update(status="killed", by="timeout", how="timeout", detail=f"over {timeout:g} s")
        return row
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        engine.unload(loaded)
        row["seconds"] = round(time.perf_counter() - start, 2)


def _select(args) -> list:
    from tests.mutation import engine

    modules = args.module or list(engine.MODULES)
    unknown = sorted(set(modules) - set(engine.MODULES))
    if unknown:
        raise SystemExit(f"usage: unknown --module {unknown}; known: {list(engine.MODULES)}")
    mutants = engine.all_mutants(modules)
    if args.only:
        mutants = [m for m in mutants if any(fnmatch.fnmatchcase(m.key, pat) for pat in args.only)]
    if getattr(args, "skip_equivalent", False):
        from tests.mutation.equivalent import EQUIVALENT

        mutants = [m for m in mutants if m.key not in EQUIVALENT]
    return mutants


def worker(args) -> int:
    """One shard: run mutants i, i+jobs, ... and write one JSON line each."""
    import torch
    from hypothesis import settings

    import pto_pytest.plugin  # noqa: F401  (registers the profiles)

    settings.load_profile("ci")
    torch.set_num_threads(1)
    mutants = _select(args)[args.shard::args.jobs]
    store_trees = [] if args.no_replay else _replay_trees(args.store)
    history = {} if args.history == "" else load_history(Path(args.history))
    with open(args.out, "a") as out:
        for m in mutants:
            out.write(json.dumps(run_one(m, store_trees, args.timeout, history.get(m.key))) + "\n")
            out.flush()
    return 0


def report(rows: list[dict], equivalent: dict[str, str], *, seconds: float, verbose: bool) -> int:
    by_module: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        st = r["status"]
        if st == "survived" and r["key"] in equivalent:
            st = "equivalent"
        by_module[r["module"]][st] += 1
        r["final"] = st
    total = Counter()
    for c in by_module.values():
        total.update(c)
    print(f"{'module':32} {'mutants':>7} {'killed':>7} {'replay':>7} {'equiv':>6} {'survived':>8}")
    for mod, c in by_module.items():
        print(f"{mod:32} {sum(c.values()):7} {c['killed']:7} {c['replay']:7} {c['equivalent']:6} {c['survived']:8}")
    n = sum(total.values())
    nonequiv = n - total["equivalent"]
    killed, replay = total["killed"], total["replay"]
    crashes = sum(1 for r in rows if r["final"] == "killed" and r.get("how") in ("crash", "timeout"))
    print(f"\n{n} mutants, {total['equivalent']} equivalent (tests/mutation/equivalent.py), {nonequiv} non-equivalent")
    if nonequiv:
        print(f"kill rate without the golden replay: {killed}/{nonequiv} = {100 * killed / nonequiv:.1f} % "
              f"({crashes} of the kills by a crash or timeout)")
        print(f"kill rate with the golden replay:    {killed + replay}/{nonequiv} = "
              f"{100 * (killed + replay) / nonequiv:.1f} %")
    print(f"wall time {seconds:.0f} s")
    stale = sorted(set(equivalent) - {r["key"] for r in rows})
    listed_killed = sorted(r["key"] for r in rows if r["key"] in equivalent and r["status"] != "survived")
    if listed_killed:
        print("\nlisted as equivalent but killed (remove from equivalent.py):")
        for k in listed_killed:
            print(f"  {k}")
    skipped = sorted({c for r in rows for c in r.get("skipped", [])})
    if skipped:
        print(f"\ncontracts that skipped under a mutant (they judged nothing; a harness fault): {skipped}")
    if stale and verbose:
        print(f"\n{len(stale)} equivalent.py keys not among the mutants run")
    for st, title in (("replay", "killed only by the golden replay (a contract is missing)"),
                      ("survived", "survivors")):
        sel = [r for r in rows if r["final"] == st]
        if sel:
            print(f"\n{title}: {len(sel)}")
            for r in sel:
                print(f"  {r['where']:42} {r['key']}")
                if verbose and r.get("detail"):
                    print(f"      {r['detail'][:200]}")
    if verbose:
        print("\nkills by contract:")
        for by, k in Counter(r["by"] for r in rows if r["final"] == "killed").most_common():
            print(f"  {k:5}  {by}")
    return 0 if not (total["replay"] or total["survived"] or skipped) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.mutation.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--module", action="append", help="mutate only this module (repeatable)")
    p.add_argument("--only", action="append", metavar="GLOB",
                   help="only mutants whose key matches this fnmatch glob (repeatable; write a literal [ as [[])")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (default 2)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per mutant before it counts as killed")
    p.add_argument("--store", default=str(ROOT / "artifacts" / "store"), help="golden store replayed for survivors")
    p.add_argument("--no-replay", action="store_true", help="do not replay the golden store for survivors")
    p.add_argument("--skip-equivalent", action="store_true",
                   help="do not run the mutants tests/mutation/equivalent.py lists (a survivor runs every contract "
                        "and the replay, so they are most of the wall time); they are counted as equivalent, "
                        "unverified -- a listed mutant that has become killable goes unnoticed")
    p.add_argument("--history", default=str(ROOT / "tests" / "mutation" / "history.json"), metavar="FILE",
                   help="which contract killed each mutant in earlier runs (read, then updated; commit it after a run): that "
                        "contract runs first, so a mutant killed before dies in its first contract. The verdicts "
                        "are the same; only the time changes (default tests/mutation/history.json)")
    p.add_argument("--no-history", action="store_const", const="", dest="history",
                   help="run the contracts in their own order, as if no run had happened before")
    p.add_argument("--json", metavar="FILE", help="write every mutant's outcome as JSON lines")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--show", metavar="GLOB", help="print the source diff of the mutants whose key matches and exit")
    p.add_argument("--verbose", "-v", action="store_true", help="details of survivors and kills per contract")
    p.add_argument("--shard", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.jobs < 1 or args.timeout <= 0:
        p.error("--jobs must be >= 1 and --timeout > 0")
    if args.shard is not None:
        return worker(args)
    mutants = _select(args)
    if args.show:
        import ast
        import difflib

        from tests.mutation import engine

        for m in mutants:
            if fnmatch.fnmatchcase(m.key, args.show):
                before = ast.unparse(engine._tree(m.module)).splitlines()
                after = engine.mutated_source(m).splitlines()
                print(f"# {m.key}  ({m.where})")
                print("\n".join(line for line in difflib.unified_diff(before, after, lineterm="", n=1)
                                if not line.startswith(("---", "+++"))))
        return 0
    if args.list:
        for m in mutants:
            print(f"{m.where:42} {m.key}")
        print(f"{len(mutants)} mutants")
        return 0
    if not mutants:
        print("no mutant matches the selection", file=sys.stderr)
        return 2
    from tests.mutation.equivalent import EQUIVALENT

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for i in range(args.jobs):
            out = Path(tmp) / f"shard{i}.jsonl"
            cmd = [sys.executable, "-m", "tests.mutation.run", "--shard", str(i), "--jobs", str(args.jobs),
                   "--out", str(out), "--timeout", str(args.timeout), "--store", args.store]
            for m in args.module or []:
                cmd += ["--module", m]
            for o in args.only or []:
                cmd += ["--only", o]
            if args.no_replay:
                cmd.append("--no-replay")
            cmd += ["--history", args.history]
            if args.skip_equivalent:
                cmd.append("--skip-equivalent")
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "CI": "true", "PYTHONHASHSEED": "0"}))
        done_before = -1
        while any(p.poll() is None for p in procs):
            time.sleep(5)
            done = sum(len(f.read_text().splitlines()) for f in Path(tmp).glob("*.jsonl"))
            if done != done_before and sys.stderr.isatty():
                print(f"\r{done}/{len(mutants)} mutants", end="", file=sys.stderr)
            done_before = done
        if any(p.returncode for p in procs):
            print(f"a worker failed (exit codes {[p.returncode for p in procs]})", file=sys.stderr)
            return 2
        rows = [json.loads(line) for f in sorted(Path(tmp).glob("*.jsonl")) for line in f.read_text().splitlines()]
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if args.skip_equivalent:  # listed, not run: counted as equivalent without being verified
        args.skip_equivalent = False
        rows += [{"key": m.key, "where": m.where, "module": m.module, "status": "survived", "by": "",
                  "how": "listed equivalent, not run", "detail": "", "seconds": 0.0}
                 for m in _select(args) if m.key in EQUIVALENT]
        print(f"{sum(1 for r in rows if r.get('how') == 'listed equivalent, not run')} listed equivalent mutants not run "
              "(--skip-equivalent)")
    if args.history:
        save_history(Path(args.history), rows)
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return report(rows, EQUIVALENT, seconds=time.perf_counter() - start, verbose=args.verbose)


if __name__ == "__main__":
    sys.exit(main())
