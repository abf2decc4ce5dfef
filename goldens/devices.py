"""``goldens replay --devices 0-15``: one worker process per device id, each replaying its share of the trees with
the backend pinned to that device through the backend's own ``--device`` option, then one table and a per-device
summary.

Trees are shared out by case (both wirings of a case go to one device), largest first onto the least loaded device
(by the bytes the tree's record declares), so one Pro-geometry tree does not stall a device behind many small ones.
Each worker is ``goldens replay CASE... --device ID --json`` with the caller's other options; its JSON rows are
merged in case order. A worker that dies or prints no JSON is an ERROR row for each of its cases, naming the device.
A built-in CPU backend takes no ids; a ``--backend-module`` of your own takes them when its OBJECT is a callable
with ``device=`` (the suite's own such module is ``tests.device_double``).

Exit code: 2 when any worker exits 2 (store or usage), else 3 when any exits 3 (backend), else 1 when any output
failed, else 0.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from goldens.errors import GoldenStoreError


def parse_devices(text: str) -> list[int]:
    """``0-15``, ``0,2,4`` or ``0-3,8``: distinct non-negative ids in the order given."""
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()) or not lo.isascii() or not hi.isascii():
            raise GoldenStoreError(f"--devices {text!r}: expected ids and ranges such as 0-15 or 0,2,4-7")
        ids = range(int(lo), int(hi) + 1) if sep else [int(lo)]
        if sep and int(hi) < int(lo):
            raise GoldenStoreError(f"--devices {text!r}: range {part} runs backwards")
        for i in ids:
            if i in out:
                raise GoldenStoreError(f"--devices {text!r}: device {i} is given twice")
            out.append(i)
    return out


def share(weights: dict[str, int], devices: list[int]) -> dict[int, list[str]]:
    """Cases onto devices: largest first, each onto the device with the fewest bytes so far (ties: the first)."""
    load = dict.fromkeys(devices, 0)
    out: dict[int, list[str]] = {d: [] for d in devices}
    for case in sorted(weights, key=lambda c: (-weights[c], c)):
        d = min(devices, key=lambda k: (load[k], devices.index(k)))
        out[d].append(case)
        load[d] += weights[case]
    return out


def tree_bytes(reader, case: str, wiring: str) -> int:
    """The bytes of a tree's tensors, from its record (nothing is read)."""
    from goldens.catalog import TreeRecord, tree_path
    from goldens.codec import torch_dtype

    rec = TreeRecord.from_attrs(reader.group_attrs(tree_path(case, wiring)), where=tree_path(case, wiring))
    return sum(math.prod(a.shape) * torch_dtype(a.dtype).itemsize for a in rec.args)


@dataclass
class DeviceRun:
    device: int
    cases: list[str]
    code: int | None = None
    seconds: float = 0.0
    document: dict | None = None
    error: str = ""
    rows: list[dict] = field(default_factory=list)


def _worker_argv(args, device: int, cases: list[str]) -> list[str]:
    argv = [sys.executable, "-m", "goldens.cli", "--store", str(args.store)]
    for m in args.cases_module:
        argv += ["--cases-module", m]
    argv += ["replay", *cases, "--json", "--device", str(device), "--wiring", args.wiring]
    for flag, value in (("--backend", args.backend), ("--backend-module", args.backend_module),
                        ("--platform", args.platform), ("--pypto-lib", args.pypto_lib), ("--rev", args.rev),
                        ("--model", getattr(args, "model", None))):
        if value is not None:
            argv += [flag, value]
    for flag, on in (("--allow-unavailable", args.allow_unavailable), ("--allow-stale", args.allow_stale),
                     ("--keep-actual", args.keep_actual), ("--verbose", args.verbose)):
        if on:
            argv.append(flag)
    for name in args.operator:
        argv += ["--operator", name]
    return argv


def run(args, items: list[tuple[str, str]], reader, devices: list[int]) -> tuple[list[DeviceRun], list[dict]]:
    """Replay ``items`` over ``devices``: (per-device runs, every row in case order)."""
    weights: dict[str, int] = {}
    for case, wiring in items:
        weights[case] = weights.get(case, 0) + tree_bytes(reader, case, wiring)
    runs = [DeviceRun(d, cases) for d, cases in share(weights, devices).items()]

    def work(r: DeviceRun) -> None:
        if not r.cases:
            return
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(_worker_argv(args, r.device, r.cases), capture_output=True, text=True)
        except OSError as exc:
            r.code, r.error = 3, f"device {r.device}: the worker could not start ({exc})"
            return
        r.seconds, r.code = time.perf_counter() - t0, proc.returncode
        try:
            r.document = json.loads(proc.stdout)
            r.rows = r.document["rows"]
        except (ValueError, KeyError, TypeError):
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
            r.error = f"device {r.device}: the worker exited {proc.returncode} without a result: {last}"
            r.code = r.code if r.code in (2, 3) else 3
            r.rows = [{"case": c, "wiring": "*", "output": "*", "comparator": "-", "verdict": "ERROR",
                       "detail": r.error, "cause": "", "evidence": []} for c in r.cases]
        else:
            if r.code not in (0, 1):
                r.error = (proc.stderr.strip().splitlines() or [""])[-1][:300]
        for row in r.rows:
            row["device"] = r.device

    threads = [threading.Thread(target=work, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    order = {c: i for i, c in enumerate(dict.fromkeys(c for c, _w in items))}
    rows = sorted((row for r in runs for row in r.rows), key=lambda row: order.get(row["case"], len(order)))
    return runs, rows


def exit_code(runs: list[DeviceRun]) -> int:
    codes = {r.code for r in runs if r.code is not None}
    for code in (2, 3, 1):
        if code in codes:
            return code
    return 0
