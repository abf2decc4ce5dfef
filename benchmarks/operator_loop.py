"""Time to verdict of one kernel's loop: ``pytest contracts/ --operator <its family>`` for every operator family
(the operators declared in one module), beside the whole ``pytest contracts/`` in the same run, each in a fresh
process as a kernel engineer runs it (one process, no xdist; wall seconds and CPU seconds of the process tree).

Run: .venv/bin/python benchmarks/operator_loop.py [--family MODULE ...] [--profile dev|ci] [--json FILE]
Goal (issue #27): every family's loop under 20 s on 2 cores.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def families() -> dict[str, list[str]]:
    from contracts.operators import OPERATORS

    out: dict[str, list[str]] = collections.defaultdict(list)
    for name, o in OPERATORS.items():
        out[o.module].append(name)
    return dict(sorted(out.items()))


def timed(args: list[str], profile: str) -> dict:
    env = {**os.environ, "HYPOTHESIS_PROFILE": profile}
    env.pop("CI", None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    last = next((line for line in reversed(proc.stdout.splitlines()) if " in " in line and "=" not in line[:1]), "")
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "exit": proc.returncode, "summary": last.strip()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", action="append", default=[], metavar="MODULE",
                        help="only these families (module names as listed; default all)")
    parser.add_argument("--profile", default="dev", choices=("dev", "ci", "thorough"),
                        help="hypothesis profile of every run (default dev: what `pytest` runs outside CI)")
    parser.add_argument("--no-whole", action="store_true", help="skip the whole-suite run")
    parser.add_argument("--per-operator", action="store_true",
                        help="also run each operator of a family whose loop is over 20 s on its own (the goal is "
                             "per operator; a family's loop is only an upper bound)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args()
    fams = families()
    chosen = {k: v for k, v in fams.items() if not args.family or k in args.family}
    rows = []
    print(f"{'family':36} {'operators':>9} {'wall s':>7} {'cpu s':>7} {'exit':>4}  result")
    for module, ops in chosen.items():
        r = timed(["contracts/", "--operator", ",".join(ops)], args.profile)
        rows.append({"family": module, "operators": ops, **r})
        print(f"{module:36} {len(ops):9d} {r['wall_s']:7.1f} {r['cpu_s']:7.1f} {r['exit']:4d}  {r['summary']}",
              flush=True)
    if args.per_operator:
        for row in [r for r in rows if r["wall_s"] > 20 and len(r["operators"]) > 1]:
            for name in row["operators"]:
                r = timed(["contracts/", "--operator", name], args.profile)
                rows.append({"family": row["family"], "operator": name, "operators": [name], **r})
                print(f"  {name:34} {'':9} {r['wall_s']:7.1f} {r['cpu_s']:7.1f} {r['exit']:4d}  {r['summary']}",
                      flush=True)
    if not args.no_whole:
        r = timed(["contracts/"], args.profile)
        rows.append({"family": "(whole contracts/)", "operators": [], **r})
        print(f"{'(whole contracts/)':36} {'':9} {r['wall_s']:7.1f} {r['cpu_s']:7.1f} {r['exit']:4d}  {r['summary']}")
    loops = [r for r in rows if r["operators"] and "operator" not in r]
    if loops:
        worst = max(loops, key=lambda r: r["wall_s"])
        print(f"slowest family loop: {worst['family']} {worst['wall_s']:.1f} s wall "
              f"({sum(r['wall_s'] > 20 for r in loops)} of {len(loops)} over 20 s); profile {args.profile}")
    singles = {r["operator"]: r for r in rows if "operator" in r}
    if singles:  # an operator's loop: its own run where one was made, else its family's (an upper bound)
        per_op = {op: singles.get(op, r)["wall_s"] for r in loops for op in r["operators"]}
        over = sorted(op for op, s in per_op.items() if s > 20)
        print(f"operators whose loop is over 20 s: {len(over)} of {len(per_op)}" + (f" ({', '.join(over)})"
                                                                                    if over else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 1 if any(r["exit"] not in (0,) for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
