"""``goldens replay --cluster ray`` on a real Ray cluster of two nodes on this machine (``ray.cluster_utils``: a head
and a second raylet, each with one CPU slot): the sample store replays with the verdicts of a local replay; a
node killed while its task runs loses nothing and keeps no tree twice; a hung task is stopped after
$PTO_DEVICE_TIMEOUT and named by its node; kept outputs land in an S3 store (the local S3 test server) once per
tree. Issue #49 items 1-2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from goldens.store import GoldenStore

ray_cluster_utils = pytest.importorskip("ray.cluster_utils", reason="Ray is in the dev extra: pip install -e '.[dev]'")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster():
    c = ray_cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def _replay(cluster, store, *args, env=None, timeout=600) -> tuple[int, dict, str]:
    proc = subprocess.run([sys.executable, "-m", "goldens.cli", "--store", str(store), "replay", "--json", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "RAY_ADDRESS": cluster.address, **(env or {})})
    try:
        return proc.returncode, json.loads(proc.stdout), proc.stderr
    except ValueError:
        return proc.returncode, {}, proc.stderr + proc.stdout[-2000:]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _verdicts(doc: dict) -> dict:
    return {(r["case"], r["wiring"], r["output"]): r["verdict"] for r in doc["rows"]}


def _kept_once(store: GoldenStore, run_id: str) -> dict[str, int]:
    """How many commits of the branch kept each tree under ``run_id`` (from each keep-actual commit's metadata)."""
    counts: dict[str, int] = {}
    for e in store.log():
        if e.metadata.get("action") == "keep-actual" and e.metadata.get("run_id") == run_id:
            for base in e.metadata.get("kept", []):
                counts[base] = counts.get(base, 0) + 1
    return counts


def test_the_sample_store_replays_on_two_nodes_with_the_verdicts_of_a_local_replay(cluster, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(ROOT / "artifacts" / "store", store)
    code, doc, err = _replay(cluster, store, "--cluster", "ray")
    assert code == 0, err[-2000:]
    local = subprocess.run([sys.executable, "-m", "goldens.cli", "--store", str(store), "replay", "--json"],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert local.returncode == 0, local.stderr[-2000:]
    assert _verdicts(doc) == _verdicts(json.loads(local.stdout)) and len(doc["rows"]) > 400
    nodes = {n["node"] for n in doc["per_node"]}
    assert len(nodes) == 2 and all(n["trees"] > 0 for n in doc["per_node"]), doc["per_node"]  # both nodes worked
    assert sum(n["trees"] for n in doc["per_node"]) == len({(c, w) for c, w, _o in _verdicts(doc)})
    assert {r["node"] for r in doc["rows"]} == nodes


def test_a_node_killed_mid_run_loses_nothing_and_keeps_no_tree_twice(cluster, tmp_path):
    """Both slots busy with slow tasks, the second node is removed (its raylet and workers killed, the task's
    process with them): Ray runs the lost task again on the head; every tree is judged and kept exactly once."""
    store = tmp_path / "store"
    shutil.copytree(ROOT / "artifacts" / "store", store)
    marks = tmp_path / "marks"
    marks.mkdir()
    cases = ["sp_slabs", "rope_rows", "metadata", "cache_index"]
    proc = subprocess.Popen([sys.executable, "-m", "goldens.cli", "--store", str(store), "replay", "--json",
                             "--cluster", "ray", "--keep-actual", "--backend-module", "tests.cluster_double:slow",
                             *cases], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RAY_ADDRESS": cluster.address, "PTO_TEST_MARKS": str(marks),
                                 "PTO_TEST_SLOW": "1.5"})
    deadline = time.monotonic() + 120
    while len(list(marks.iterdir())) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert len(list(marks.iterdir())) >= 2, "two tasks never ran at once"
    running = [int(m.name) for m in marks.iterdir()]
    victim = next(n for n in cluster.worker_nodes if n is not cluster.head_node)
    cluster.remove_node(victim)
    time.sleep(2)  # the victim's task process dies with its worker at once; the head's is still sleeping in its calls
    alive = [pid for pid in running if _alive(pid)]
    assert len(alive) < len(running), f"a task process outlived its node: {alive}"
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    doc = json.loads(out)
    trees = {(r["case"], r["wiring"]) for r in doc["rows"]}
    assert {c for c, _w in trees} == set(cases) and {r["verdict"] for r in doc["rows"]} == {"PASS"}
    assert len(doc["per_node"]) >= 1 and sum(n["trees"] for n in doc["per_node"]) == len(trees), doc["per_node"]
    counts = _kept_once(GoldenStore(store), doc["run_id"])
    assert sorted(counts) == sorted(f"actual/torch-slow-cpu/{c}/{w}" for c, w in trees), counts
    assert set(counts.values()) == {1}, f"a tree kept twice: {counts}"
    assert sorted(doc["kept"]) == sorted(f"torch-slow-cpu/{c}/{w}" for c, w in trees)
    started = [int(m.name) for m in marks.iterdir()]
    assert len(started) > len(doc["per_device"]), "no task was run again: the node died with nothing in hand"
    for pid in started:  # the killed node's task process died with its worker (no orphan left to commit later)
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    cluster.add_node(num_cpus=1)  # (the module's other tests run on two nodes again)
    cluster.wait_for_nodes()


def test_a_hung_task_is_stopped_after_the_device_timeout_and_names_its_node(cluster, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(ROOT / "artifacts" / "store", store)
    t0 = time.monotonic()
    code, doc, err = _replay(cluster, store, "--cluster", "ray", "--backend-module", "tests.cluster_double:hang",
                             "rope_rows", env={"PTO_DEVICE_TIMEOUT": "3"})
    assert code == 3 and time.monotonic() - t0 < 120, err[-2000:]
    (row,) = [r for r in doc["rows"] if r["case"] == "rope_rows"]
    assert row["verdict"] == "ERROR" and row["node"] in row["detail"], row
    assert "did not finish within 3 s ($PTO_DEVICE_TIMEOUT) and was stopped" in row["detail"], row


def test_kept_outputs_land_in_an_s3_store_once_per_tree(cluster, s3_store):
    from goldens import trees

    store = GoldenStore(s3_store)
    cases = ["sp_slabs", "rope_rows", "metadata", "cache_index", "v4_decode_metadata", "v4_index_keys"]
    trees.record(store, [(c, w) for c in cases for w in ("replicated",)], seed=3)
    code, doc, err = _replay(cluster, s3_store, "--cluster", "ray", "--keep-actual")
    assert code == 0, err[-2000:]
    assert len({n["node"] for n in doc["per_node"]}) == 2, doc["per_node"]
    counts = _kept_once(store, doc["run_id"])
    assert sorted(counts) == sorted(f"actual/torch-cpu/{c}/replicated" for c in cases), counts
    assert set(counts.values()) == {1}
    assert GoldenStore(s3_store).reader().has("actual/torch-cpu/rope_rows/replicated/rope_cos")


def test_a_bad_cluster_is_one_line(tmp_path, capsys):
    from goldens import cli

    shutil.copytree(ROOT / "artifacts" / "store", tmp_path / "store")
    for spec, code, said in (("spark", 2, "expected ray or ray://HOST:PORT"),
                             ("ray://127.0.0.1:1", 3, "cannot reach a Ray cluster")):
        got = cli.main(["--store", str(tmp_path / "store"), "replay", "--cluster", spec, "rope_rows"])
        text = capsys.readouterr().err
        assert got == code and said in text and "Traceback" not in text, (spec, got, text)
    got = cli.main(["--store", str(tmp_path / "store"), "replay", "--cluster", "ray", "--devices", "0,1"])
    assert got == 2 and "not with --devices" in capsys.readouterr().err


def test_the_upstream_survey_runs_on_the_cluster_with_the_statuses_of_a_local_survey(cluster, tmp_path):
    """`python -m backends.upstream.survey --cluster ray`: each driver module a task on a node; the statuses are
    the local survey's (tests/test_survey.py's drivers: a pass, a compile failure, a refused validation, a platform
    not offered, a timeout, an unjudged exit 0), and each line names the node it ran on."""
    from tests.test_survey import _checkout

    root = _checkout(tmp_path)
    env = {**os.environ, "PTO_UPSTREAM_PYTHON": sys.executable, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}",
           "RAY_ADDRESS": cluster.address}
    got = {}
    for where, extra in (("local", []), ("cluster", ["--cluster", "ray"])):
        results = tmp_path / f"{where}.jsonl"
        proc = subprocess.run([sys.executable, "-m", "backends.upstream.survey", "--pypto-lib", str(root),
                               "--timeout", "5", "--results", str(results), *extra], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got[where] = {r["module"]: r for r in map(json.loads, results.read_text().splitlines())}
    assert {m: r["status"] for m, r in got["cluster"].items()} == {m: r["status"] for m, r in got["local"].items()}
    assert len(got["cluster"]) == 6 and all(r["node"].count("/") == 1 for r in got["cluster"].values())
    assert not any(r["node"] for r in got["local"].values())
