"""The Ray executor's scheduling overhead on one machine (#49 item 5): the same trees replayed, in one run, by the
local pool (``goldens replay --devices 0,1``) and by ``goldens replay --cluster ray`` on a one-node Ray cluster
this script starts with the same two CPU slots; one process (no pool at all) is the floor. Both pools run the
same tasks (``goldens.devices``), so the difference is Ray's: starting its workers, shipping each task, and the
smaller tasks it is given (four per slot, so that a lost node loses little). Repeats alternate the three.

Backend: ``tests.device_double:backend`` (the Torch reference pinned to a device id: the local pool needs ids).
Run: .venv/bin/python benchmarks/cluster.py [--store artifacts/store] [--repeats 3] [CASE ...]
Goal: the Ray executor within 1.5x of the local pool's wall time on one machine; its gain is more machines.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOUBLE = ["--backend-module", "tests.device_double:backend"]


def _replay(store: str, cases: list[str], extra: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "goldens.cli", "--store", store, "replay", "--quiet", *cases,
                           *DOUBLE, *extra], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"replay {' '.join(extra)} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="*", help="default: every tree of the store")
    ap.add_argument("--store", default=str(ROOT / "artifacts" / "store"))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    env = {**os.environ, "RAY_ADDRESS": cluster.address}
    ways = {"one process": [], "local pool (--devices 0,1)": ["--devices", "0,1"],
            "Ray, one node (--cluster ray)": ["--cluster", "ray"]}
    times: dict[str, list[float]] = {k: [] for k in ways}
    try:
        _replay(args.store, args.cases, ways["Ray, one node (--cluster ray)"], env)  # Ray's workers warm
        for _ in range(args.repeats):
            for name, extra in ways.items():
                times[name].append(_replay(args.store, args.cases, extra, env))
    finally:
        cluster.shutdown()
    base = statistics.median(times["local pool (--devices 0,1)"])
    print(f"{args.store} ({'every tree' if not args.cases else ', '.join(args.cases)}), {args.repeats} repeats, "
          "median wall seconds")
    for name, got in times.items():
        med = statistics.median(got)
        print(f"  {name:32} {med:7.2f} s  ({med / base:4.2f}x the local pool)  runs: "
              + ", ".join(f"{t:.1f}" for t in got))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
