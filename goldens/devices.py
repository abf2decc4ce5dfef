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

import contextlib
import json
import math
import os
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


def case_weights(reader, items: list[tuple[str, str]]) -> dict[str, int]:
    """Each case's bytes over the wirings asked for (what ``share`` balances)."""
    weights: dict[str, int] = {}
    for case, wiring in items:
        weights[case] = weights.get(case, 0) + tree_bytes(reader, case, wiring)
    return weights


@dataclass
class DeviceRun:
    """One task of a distributed replay: its cases, the device (None: a CPU backend's task) and, once run, the node
    it ran on, its exit code, seconds, JSON document and rows."""

    device: int | None
    cases: list[str]
    code: int | None = None
    seconds: float = 0.0
    document: dict | None = None
    error: str = ""
    rows: list[dict] = field(default_factory=list)
    node: str = "local"


def worker_argv(args, device: int | None, cases: list[str], *, run_id: str | None = None) -> list[str]:
    """The ``goldens replay`` one task runs: its cases, --json, its device, and the caller's other options."""
    argv = [sys.executable, "-m", "goldens.cli", "--store", str(args.store)]
    for m in args.cases_module:
        argv += ["--cases-module", m]
    argv += ["replay", *cases, "--json", "--wiring", args.wiring]
    if device is not None:
        argv += ["--device", str(device)]
    for flag, value in (("--backend", args.backend), ("--backend-module", args.backend_module),
                        ("--platform", args.platform), ("--pypto-lib", args.pypto_lib), ("--rev", args.rev),
                        ("--model", getattr(args, "model", None)), ("--run-id", run_id)):
        if value is not None:
            argv += [flag, value]
    for flag, on in (("--allow-unavailable", args.allow_unavailable), ("--allow-stale", args.allow_stale),
                     ("--keep-actual", args.keep_actual), ("--verbose", args.verbose)):
        if on:
            argv.append(flag)
    for name in args.operator:
        argv += ["--operator", name]
    return argv


def run_task(argv: list[str], *, timeout: float | None, where: str, env: dict | None = None) -> dict:
    """Run one task's ``goldens replay`` to the end, or stop it (its whole process group) after ``timeout``
    seconds: {"code", "stdout", "stderr", "seconds", "timed_out"}. Shared by the local pool and the cluster's
    tasks, so both report a hang the same way. The task dies with this process (``backends.lifetime``)."""
    from backends import lifetime

    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**(os.environ if env is None else env), lifetime.TASK: str(os.getpid())},
                                start_new_session=True)
    except OSError as exc:
        return {"code": 3, "stdout": "", "stderr": f"{where}: the task could not start ({exc})",
                "seconds": 0.0, "timed_out": False}
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        timed_out = True
    return {"code": proc.returncode, "stdout": out, "stderr": err, "seconds": time.perf_counter() - t0,
            "timed_out": timed_out}


def settle(r: DeviceRun, result: dict, *, where: str, timeout: float | None) -> None:
    """Fill ``r`` from a finished task: its JSON rows, or an ERROR row per case naming where it ran (a task that
    died, printed no JSON, or was stopped after ``timeout`` seconds)."""
    r.seconds, r.code = result["seconds"], result["code"]
    try:
        if result["timed_out"]:
            raise ValueError("timed out")
        r.document = json.loads(result["stdout"])
        r.rows = r.document["rows"]
    except (ValueError, KeyError, TypeError):
        if result["timed_out"]:
            r.error = (f"{where}: the task did not finish within {timeout:g} s ($PTO_DEVICE_TIMEOUT) and was "
                       "stopped")
            r.code = 3
        else:
            last = (result["stderr"].strip().splitlines() or ["no output"])[-1][:300]
            r.error = f"{where}: the worker exited {result['code']} without a result: {last}"
            r.code = r.code if r.code in (2, 3) else 3
        r.rows = [{"case": c, "wiring": "*", "output": "*", "comparator": "-", "verdict": "ERROR",
                   "detail": r.error, "cause": "", "evidence": []} for c in r.cases]
    else:
        if r.code not in (0, 1):
            r.error = (result["stderr"].strip().splitlines() or [""])[-1][:300]
    for row in r.rows:
        row["device"] = r.device
        row["node"] = r.node


def tree_timeout(args) -> float | None:
    """Seconds a task may spend per tree before it is stopped: $PTO_DEVICE_TIMEOUT (a device backend's limit for one
    launch, compile included; default 1800); None (no limit) for a built-in CPU backend when the variable is
    unset."""
    from backends.upstream.client import TIMEOUT_ENV, UpstreamError, device_timeout

    try:
        per_launch = device_timeout()
    except UpstreamError as exc:
        raise GoldenStoreError(str(exc)) from None
    return None if os.environ.get(TIMEOUT_ENV) is None and args.backend in ("torch", "emulated") \
        and not args.backend_module else per_launch


def task_limit(per_tree: float | None, items: list[tuple[str, str]], cases: list[str]) -> float | None:
    """Seconds a task of ``cases`` may run: the per-tree limit times its trees among ``items`` (None: no limit)."""
    return None if per_tree is None else per_tree * sum(c in cases for c, _w in items)


def verdict_counts(rows: list[dict]) -> dict[str, int]:
    """{"passed", "failed", "errors"}: the rows of each verdict (a task's summary, per device or per node)."""
    return {k: sum(r["verdict"] == v for r in rows) for k, v in (("passed", "PASS"), ("failed", "FAIL"),
                                                                   ("errors", "ERROR"))}


def ordered_rows(runs: list[DeviceRun], items: list[tuple[str, str]]) -> list[dict]:
    """Every task's rows merged, in the order of the cases asked for."""
    order = {c: i for i, c in enumerate(dict.fromkeys(c for c, _w in items))}
    return sorted((row for r in runs for row in r.rows), key=lambda row: order.get(row["case"], len(order)))


def run(args, items: list[tuple[str, str]], reader, devices: list[int],
        run_id: str | None = None) -> tuple[list[DeviceRun], list[dict]]:
    """Replay ``items`` over ``devices`` on this host: one task per device, its cases shared out by bytes
    (``share``); (per-device runs, every row in case order)."""
    weights = case_weights(reader, items)
    runs = [DeviceRun(d, cases) for d, cases in share(weights, devices).items()]
    per_tree = tree_timeout(args)

    def work(r: DeviceRun) -> None:
        if not r.cases:
            return
        where = f"device {r.device}"
        limit = task_limit(per_tree, items, r.cases)
        settle(r, run_task(worker_argv(args, r.device, r.cases, run_id=run_id), timeout=limit, where=where),
               where=where,
               timeout=limit)

    threads = [threading.Thread(target=work, args=(r,)) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return runs, ordered_rows(runs, items)


def exit_code(runs: list[DeviceRun]) -> int:
    codes = {r.code for r in runs if r.code is not None}
    for code in (2, 3, 1):
        if code in codes:
            return code
    return 0
