"""Many devices: ``goldens replay --devices IDS`` (one worker process per id, the backend pinned through its
``--device`` option, a per-device summary) and ``pytest -n N --devices IDS`` (xdist worker K pinned to the K-th
id). Run here with a device backend of the suite's own (``tests.device_double``: the reference pinned to the ids
it is given, loaded with --backend-module as any out-of-tree device backend is)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from goldens import cli, devices, trees
from goldens.errors import GoldenStoreError
from goldens.store import GoldenStore
from pto_pytest import plugin
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
DOUBLE = ("--backend-module", "tests.device_double:backend")


def test_device_lists_parse_and_refuse_by_name():
    assert devices.parse_devices("0-3") == [0, 1, 2, 3]
    assert devices.parse_devices("0,2,4-6") == [0, 2, 4, 5, 6]
    assert devices.parse_devices("15") == [15]
    for bad, text in (("0-3,2", "device 2 is given twice"), ("3-1", "runs backwards"), ("", "expected ids"),
                      ("0,x", "expected ids"), ("-1", "expected ids"), ("1-", "expected ids"),
                      ("\u0661", "expected ids")):
        with pytest.raises(GoldenStoreError, match=text):
            devices.parse_devices(bad)


def test_cases_are_shared_largest_first_onto_the_least_loaded_device():
    got = devices.share({"a": 10, "b": 7, "c": 5, "d": 4, "e": 1}, [3, 9])
    assert got == {3: ["a", "d"], 9: ["b", "c", "e"]}, got  # 14 and 13 bytes
    assert devices.share({"a": 1}, [0, 1, 2]) == {0: ["a"], 1: [], 2: []}


def test_the_worst_worker_sets_the_exit_code():
    runs = lambda *codes: [devices.DeviceRun(i, ["x"], code=c) for i, c in enumerate(codes)]  # noqa: E731
    assert devices.exit_code(runs(0, 0)) == 0
    assert devices.exit_code(runs(0, 1)) == 1
    assert devices.exit_code(runs(1, 3, 0)) == 3
    assert devices.exit_code(runs(3, 2, 1)) == 2
    assert devices.exit_code(runs(None, 0)) == 0  # a device given no case ran nothing


@pytest.fixture
def small_store(tmp_path):
    store = GoldenStore(tmp_path / "store")
    trees.record(store, [("rope_rows", "replicated"), ("sp_slabs", "replicated"), ("sp_slabs", "sharded"),
                         ("metadata", "replicated")], seed=5)
    return store


def _replay(store, *args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["--store", str(store.root), "replay", *args])
    return code, out.getvalue(), err.getvalue()


def test_replay_spreads_the_trees_over_one_pinned_worker_per_device(small_store, monkeypatch):
    monkeypatch.setattr(sys, "executable", forkserver.python())  # the workers fork from the test fork server
    code, out, err = _replay(small_store, "--devices", "4,7", "--json", *DOUBLE)
    assert code == 0, out[-2000:] + err[-2000:]
    doc = json.loads(out)
    assert doc["devices"] == [4, 7] and doc["exit_code"] == 0
    where = {}
    for row in doc["rows"]:
        assert row["verdict"] == "PASS", row
        where.setdefault(row["case"], set()).add(row["device"])
    assert set(where) == {"rope_rows", "sp_slabs", "metadata"}
    assert all(len(d) == 1 for d in where.values()), "both wirings of a case on one device"
    per = {r["device"]: r for r in doc["per_device"]}
    assert {d: r["backend_devices"] for d, r in per.items()} == {4: [4], 7: [7]}, \
        "each worker's backend was built with its own --device"
    assert sum(r["trees"] for r in per.values()) == 4 and all(r["trees"] for r in per.values())
    assert sum(r["passed"] for r in per.values()) == len(doc["rows"])
    # the table: a device column and the per-device summary
    code, out, _ = _replay(small_store, "rope_rows", "--devices", "4", *DOUBLE)
    assert code == 0 and "per device" in out and "┃ device ┃ case " in out and "PASS" in out, out[-1500:]


def test_a_device_whose_worker_dies_is_an_error_row_naming_it(small_store, monkeypatch):
    monkeypatch.setattr(sys, "executable", forkserver.python())
    args = argparse.Namespace(store=str(small_store.root), cases_module=[], wiring="both", backend="torch",
                              backend_module="tests.no_such_module:BACKEND", platform=None, pypto_lib=None,
                              rev=None, allow_unavailable=False, allow_stale=False, keep_actual=False, verbose=False,
                              operator=[])
    reader = small_store.reader()
    runs, rows = devices.run(args, [("rope_rows", "replicated"), ("metadata", "replicated")], reader, [2, 6])
    assert devices.exit_code(runs) in (2, 3)
    assert {r["verdict"] for r in rows} == {"ERROR"} and {r["device"] for r in rows} == {2, 6}
    assert all(f"device {r['device']}: the worker exited" in r["detail"] for r in rows), rows


def test_replay_devices_refuses_what_it_cannot_combine(small_store, monkeypatch):
    code, _, err = _replay(small_store, "--devices", "0-1")
    assert code == 2 and "'torch' runs on the CPU" in err, err  # a CPU backend takes no id
    code, _, err = _replay(small_store, "--devices", "0-1", "--backend-module", "backends:torch_backend")
    assert code == 2 and "torch_backend takes no device ids (--device 0,1)" in err, err  # a module that takes none
    for extra, text in ((["--device", "0", *DOUBLE], "with --device"), (["--backend", "recorded"], "--backend recorded")):
        code, _, err = _replay(small_store, "--devices", "0-1", *extra)
        assert code == 2 and text in err, err


def test_pytest_gives_each_xdist_worker_its_device_and_sums_up_per_device():
    env = {**os.environ, forkserver.EXECUTABLE: forkserver.python()}  # xdist workers forked
    proc = forkserver.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--devices", "3,5", "contracts/test_rope.py",
                           *DOUBLE, "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-1500:]
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "per-device summary" in line)
    rows = {line.split()[0]: line.split()[1:] for line in lines[start + 2:start + 4]}
    assert set(rows) == {"3", "5"} and all(int(r[0]) > 0 for r in rows.values()), lines[start:start + 4]


def test_pytest_needs_one_worker_per_device():
    def config(**options):
        values = {"devices": None, "device": None, "numprocesses": None, **options}
        return SimpleNamespace(getoption=lambda name, default=None: values.get(name, default))

    with pytest.raises(pytest.UsageError, match=r"3 device\(s\) need -n 3 \(one xdist worker per device\), got -n 2"):
        plugin.worker_device(config(devices="0-2", numprocesses=2))
    with pytest.raises(pytest.UsageError, match="not both"):
        plugin.worker_device(config(devices="0-1", device="0", numprocesses=2))
    with pytest.raises(pytest.UsageError, match="given twice"):
        plugin.worker_device(config(devices="1,1", numprocesses=2))
    assert plugin.worker_device(config(devices="0-2", numprocesses=3)) == "0,1,2"
    worker = config(devices="4,9", numprocesses=2)
    worker.workerinput = {"workerid": "gw1"}
    assert plugin.worker_device(worker) == "9"
    assert plugin.worker_device(config(device="2")) == "2"


def test_xdist_workers_share_the_cores_out_among_themselves():
    """``-n N``: each worker runs torch on cores // N threads (at least one), so N workers do not each spin up
    a thread per core; outside a worker, or with OMP_NUM_THREADS given, torch is left alone."""
    share = plugin.worker_threads
    assert share({"workerid": "gw0", "workercount": 2}, {}, 2) == 1
    assert share({"workerid": "gw1", "workercount": 2}, {}, 16) == 8
    assert share({"workerid": "gw3", "workercount": 4}, {"OMP_NUM_THREADS": ""}, 2) == 1
    assert share({"workerid": "gw0", "workercount": 3}, {}, 8) == 2
    assert share(None, {}, 2) is None and share({}, {}, 2) is None
    assert share({"workerid": "gw0", "workercount": 2}, {"OMP_NUM_THREADS": "4"}, 2) is None
    assert share({"workerid": "gw0", "workercount": 2}, {}, None) == 1


def test_a_run_keeps_each_tree_once_however_often_its_tasks_finish(small_store):
    """#49: a task run again (its node died after it committed) or finishing twice keeps each tree once: kept outputs
    carry the run's id and a tree the branch head already holds under it is left alone, decided inside the
    commit. Four processes keep the same run at once; then the same run again from here: one commit kept each
    tree, every other kept nothing."""
    import multiprocessing

    from backends import torch_backend

    store, run_id = small_store, "run-under-test"
    ctx = multiprocessing.get_context("spawn")  # (fork after icechunk's threads can deadlock)
    procs = [ctx.Process(target=_keep_the_run, args=(str(store.root), run_id)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    before = len(store.log())
    _keep_the_run(str(store.root), run_id)
    assert len(store.log()) == before, "the same run kept again"
    counts: dict = {}
    for e in store.log():
        if e.metadata.get("run_id") == run_id:
            for base in e.metadata["kept"]:
                counts[base] = counts.get(base, 0) + 1
    want = {f"actual/{torch_backend().name}-cpu/{c}/{w}" for c, w in _KEPT}
    assert counts == dict.fromkeys(want, 1), counts
    other = _keep_the_run(str(store.root), "another-run")  # another run keeps its own outputs
    assert other is not None


_KEPT = [("rope_rows", "replicated"), ("sp_slabs", "replicated"), ("sp_slabs", "sharded")]


def _keep_the_run(root: str, run_id: str):
    from backends import torch_backend

    store = GoldenStore(root)
    reader = store.reader()
    kept = {(c, w): trees.load_tree(reader, c, w).expected for c, w in _KEPT}
    return trees.keep_actual(store, torch_backend(), reader.snapshot, kept, {}, run_id=run_id).snapshot
