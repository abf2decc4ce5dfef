"""What the compile cache saves (#49 items 3 and 5): each tree replayed twice on a device backend with a fresh
``$PTO_COMPILE_CACHE``, in one run. The first replay compiles and stores the build; the second finds it and hands
it to upstream's runner as ``runtime_dir``. Printed: each run's wall time, the launch's own time from the
upstream worker's log (``[RUN] PASS (s)``), and whether the second skipped compiling ("runtime_only").

Needs the a5sim toolchain and a checkout (docs/a5sim.md), and a store holding the trees, e.g.
``goldens --store /tmp/pro record --geometry pro v4_hc_post_pro final_norm_pro v4_gate_hash_pro``. Run:

    PTO_UPSTREAM_PYTHON=/opt/pto-a5sim/bin/python .venv/bin/python benchmarks/compile_cache.py \\
        --store /tmp/pro --pypto-lib ~/pypto-lib v4_hc_post_pro final_norm_pro v4_gate_hash_pro

Goal: the second run's launch at least 5x faster than the first. Measured 2026-12-04 (docs/a5sim.md, "Compiled
entries reused"): launch 3.18 -> 0.19 s, 3.52 -> 0.27 s; wall 8.9 -> 5.0 s, 19.1 -> 6.7 s, 8.1 -> 5.3 s.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _newest_worker_log(after: float) -> str:
    logs = [p for p in glob.glob(os.path.join(tempfile.gettempdir(), "pto-upstream-worker-*.log"))
            if os.path.getmtime(p) >= after]
    return Path(max(logs, key=os.path.getmtime)).read_text(errors="replace") if logs else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--store", required=True)
    ap.add_argument("--pypto-lib", required=True)
    ap.add_argument("--platform", default="a5sim")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pto-compile-cache-bench-") as cache:
        env = {**os.environ, "PTO_COMPILE_CACHE": cache}
        print(f"{'case':24} {'run':7} {'wall s':>7} {'launch s':>9}  skipped compiling  exit")
        for case in args.cases:
            for run in ("first", "second"):
                t0 = time.time()
                proc = subprocess.run([sys.executable, "-m", "goldens.cli", "--store", args.store, "replay", case,
                                       "--backend", "pypto", "--platform", args.platform, "--pypto-lib",
                                       args.pypto_lib], cwd=ROOT, env=env, capture_output=True, text=True)
                wall = time.time() - t0
                log = _newest_worker_log(t0)
                launches = re.findall(r"\[RUN\] (?:PASS|FAIL) \(([\d.]+)s\)", log)
                skipped = "runtime_only: skipping" in log
                print(f"{case:24} {run:7} {wall:7.1f} {'+'.join(launches) or '-':>9}  {str(skipped):17}  "
                      f"{proc.returncode}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
