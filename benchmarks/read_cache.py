"""What the read cache's chunk check costs (#48 item 1): every tree of a store read with ``read_many`` in one run,
three ways, CPU seconds and wall time side by side:

- cold: no read cache (every array decoded from the store's chunks, as on another machine's first replay);
- first: an empty read cache (the check's fetch of the raw chunk bytes, their decoding, and the cache written):
  the price of a miss;
- warm: the read cache and its packs warm -- each array served only after the store's raw chunk bytes for it are
  fetched and their CRC32C fingerprint matches the one the entry was written under;
- check only: the fingerprints alone (the price of never hiding damage).

Run: .venv/bin/python benchmarks/read_cache.py [--store artifacts/store] [--repeats 3]
Goal: warm <= 1.0x cold -- the check never makes a cached read cost more than reading the store. Measured
2026-12-04 on 2 shared cores (an a5sim build running niced beside it: repeat-to-repeat spread about 30 %):
- the sample store (2,183 arrays, 109 trees): warm 0.79-0.81x cold, check only 0.73-0.76x; first 1.12-1.21x cold
  (the same run with a miss fetching each chunk twice, the code before: 1.38x);
- five V4-Pro trees at the model's geometry (`goldens record --geometry pro`, 324 MB, 53 arrays): warm 0.53-0.73x
  cold, check only 0.47-0.64x; first 1.7-2.9x cold (writing 324 MB of cache entries dominates it).
Table and documentation: docs/reference.md ("The read cache").
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def _paths(reader) -> list[list[str]]:
    from goldens import trees

    out = []
    for case in trees.recorded_cases(reader):
        for wiring in trees.recorded_wirings(reader, case):
            out.append(reader.walk_arrays(f"{case}/{wiring}"))
    return out


def _timed(fn) -> tuple[float, float]:
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default="artifacts/store")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from goldens.store import GoldenStore

    with tempfile.TemporaryDirectory() as cache:
        os.environ["PTO_STORE_READ_CACHE"] = ""  # the cold store: no read cache at all
        cold_store = GoldenStore(Path(args.store))
        del os.environ["PTO_STORE_READ_CACHE"]
        store = GoldenStore(Path(args.store), read_cache=Path(cache) / "read-cache")
        trees_paths = _paths(store.reader())
        rows = {"cold": [], "first": [], "warm": [], "check only": []}
        for i in range(args.repeats):
            cold = cold_store.reader()
            rows["cold"].append(_timed(lambda r=cold: [r.read_many(p) for p in trees_paths]))
            fill = GoldenStore(Path(args.store), read_cache=Path(cache) / f"first-{i}").reader()
            rows["first"].append(_timed(lambda r=fill: [r.read_many(p) for p in trees_paths]))
            fill = store.reader()
            [fill.read_many(p) for p in trees_paths]  # fill the cache and the packs
            warm = store.reader()
            rows["warm"].append(_timed(lambda r=warm: [r.read_many(p) for p in trees_paths]))
            check = store.reader()
            rows["check only"].append(_timed(lambda r=check: [r._fingerprints_of(p) for p in trees_paths]))
    base = statistics.median(c for c, _w in rows["cold"])
    print(f"{sum(len(p) for p in trees_paths)} arrays in {len(trees_paths)} trees of {args.store}, "
          f"{args.repeats} repeats (median)")
    for name, got in rows.items():
        cpu, wall = statistics.median(c for c, _w in got), statistics.median(w for _c, w in got)
        print(f"  {name:11} CPU {cpu:7.3f} s ({cpu / base:5.2f}x cold)   wall {wall:7.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
