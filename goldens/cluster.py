"""``goldens replay --cluster ray[://ADDRESS]``: the same tasks as ``--devices`` (``goldens.devices``: each a
``goldens replay CASE --json`` process, judged and merged the same way), scheduled by Ray over every node of a
cluster instead of a pool of processes on one host.

- The cases (both wirings of each together) are shared out by bytes (``goldens.devices.share``, as the local pool
  does) into four tasks per slot the cluster offers, and Ray hands each task to a node with a free slot. A task
  asks for what it needs: one device of Ray's Ascend resource (``NPU``) on ``--platform a5``, else
  ``--task-cpus`` CPU slots (a5sim's compile and simulation, or a CPU backend). On a5 the task is given the id
  Ray assigned it with ``--device``.
- A node or worker that dies takes its task with it: Ray runs it again on another node (``max_retries``). A task's
  process dies with the Ray worker that started it; kept outputs are committed under the run's id, and a tree
  already kept under it is not kept again (``goldens.trees.keep_actual``), so a task run twice keeps each tree
  once.
- A task that runs past ``$PTO_DEVICE_TIMEOUT`` seconds per tree is stopped and is an ERROR row naming its node.
- The store must be one every node reaches: an ``s3://`` store, or a path on a filesystem they share (the file lock
  then serialises the commits of tasks that finish together; S3 commits are optimistic and rerun).

``ray`` connects to ``$RAY_ADDRESS``, else to the cluster ``ray start`` left on this machine, else starts one here;
``ray://HOST:PORT`` goes through the Ray client. Ray is an optional extra: ``pip install -e '.[cluster]'``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from goldens.devices import (
    DeviceRun,
    case_weights,
    ordered_rows,
    settle,
    share,
    task_limit,
    tree_timeout,
    verdict_counts,
    worker_argv,
)
from goldens.errors import BackendFailure, GoldenStoreError

ASCEND_RESOURCE = "NPU"  # the resource name of Ray's Ascend NPU support (ray.util.accelerators)
FORWARDED_ENV = ("PTO_", "PYPTO_", "AWS_", "HYPOTHESIS_")  # the caller's settings a task on another node needs
TASKS_PER_SLOT = 4  # tasks per slot the cluster offers: small enough to balance and to lose little with a node


def connect(spec: str):
    """``backends.cluster.connect``, its errors as goldens reports them: a bad spec or no Ray is a usage error
    (exit 2), an unreachable cluster a backend error (exit 3)."""
    from backends.cluster import ClusterUnreachable, ClusterUsage
    from backends.cluster import connect as ray_connect

    try:
        return ray_connect(spec)
    except ClusterUsage as exc:
        raise GoldenStoreError(str(exc)) from None
    except ClusterUnreachable as exc:
        raise BackendFailure(str(exc)) from None


def _absolute(args) -> dict:
    """The paths a task on another node is given, made absolute (its working folder is not the caller's)."""
    fix = {}
    if "://" not in str(args.store):
        fix["store"] = str(Path(args.store).resolve())
    if args.pypto_lib:
        fix["pypto_lib"] = str(Path(os.path.expanduser(args.pypto_lib)).resolve())
    fix["cases_module"] = [str(Path(m).resolve()) if m.endswith(".py") else m for m in args.cases_module]
    if args.backend_module and ".py:" in args.backend_module:
        path, _, obj = args.backend_module.rpartition(":")
        fix["backend_module"] = f"{Path(path).resolve()}:{obj}"
    return fix


def _task(argv: list[str], env: dict, timeout: float | None, device_resource: str | None) -> dict:
    """One Ray task: run the case's ``goldens replay`` on this node (``goldens.devices.run_task``)."""
    import ray

    from backends.cluster import node_label
    from goldens import devices

    ctx = ray.get_runtime_context()
    node = node_label()
    environ = {**os.environ, **env}
    device = None
    if device_resource:
        ids = ctx.get_accelerator_ids().get(device_resource) or []
        if ids:  # the physical id Ray assigned: given as --device, with no visibility mask under it
            device = int(ids[0])
            argv = [*argv, "--device", str(device)]
            environ.pop("ASCEND_RT_VISIBLE_DEVICES", None)
    argv = [sys.executable, *argv[1:]]  # this node's Python, not the caller's path to it
    result = devices.run_task(argv, timeout=timeout, where=f"node {node}", env=environ)
    return {**result, "node": node, "device": device}


def run(args, items: list[tuple[str, str]], reader, run_id: str | None = None) -> tuple[list[DeviceRun], list[dict]]:
    """Replay ``items`` on the cluster; (per-task runs, every row in case order). What Ray prints meanwhile (a
    lost task's retry, a node gone) goes to stderr: stdout carries only the table or the JSON document."""
    import contextlib

    with contextlib.redirect_stdout(sys.stderr):
        ray = connect(args.cluster)
        try:
            return _run(ray, args, items, reader, run_id)
        finally:
            ray.shutdown()


def _run(ray, args, items, reader, run_id):
    import argparse

    args = argparse.Namespace(**{**vars(args), **_absolute(args)})
    weights = case_weights(reader, items)
    per_tree = tree_timeout(args)
    device_resource = ASCEND_RESOURCE if args.platform == "a5" else None
    from backends.cluster import MAX_RETRIES, finished

    options = {"max_retries": MAX_RETRIES, "retry_exceptions": False}
    options.update({"num_cpus": 0, "resources": {ASCEND_RESOURCE: 1}} if device_resource else
                   {"num_cpus": args.task_cpus})
    have = ray.cluster_resources()
    slots = int(have.get(ASCEND_RESOURCE, 0)) if device_resource else int(have.get("CPU", 0) // args.task_cpus)
    if slots < 1:
        raise BackendFailure(f"--cluster {args.cluster}: no node offers what a task asks for ("
                             + (f"an {ASCEND_RESOURCE}" if device_resource else f"{args.task_cpus:g} CPU")
                             + f"; the cluster has {dict(have)})")
    tasks = [cs for cs in share(weights, list(range(min(len(weights), TASKS_PER_SLOT * slots)))).values() if cs]
    remote = ray.remote(**options)(_task)
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}
    runs, pending = [], {}
    for cases in tasks:
        r = DeviceRun(None, cases)
        limit = task_limit(per_tree, items, cases)
        ref = remote.remote(worker_argv(args, None, cases, run_id=run_id), env, limit, device_resource)
        runs.append(r)
        pending[ref] = (r, limit)
    t0 = time.perf_counter()
    for (r, limit), result, lost in finished(ray, pending):
        if lost is not None:
            result = {"code": 3, "stdout": "", "stderr": lost, "seconds": time.perf_counter() - t0,
                      "timed_out": False, "node": "?", "device": None}
        r.node, r.device = result["node"], result["device"]
        settle(r, result, where=f"node {r.node}", timeout=limit)
    return runs, ordered_rows(runs, items)


def by_node(runs: list[DeviceRun]) -> list[dict]:
    """Per node: tasks, trees, passed / failed / errors, seconds."""
    out: dict[str, dict] = {}
    for r in runs:
        s = out.setdefault(r.node, {"node": r.node, "tasks": 0, "trees": 0, "passed": 0, "failed": 0, "errors": 0,
                                    "seconds": 0.0})
        s["tasks"] += 1
        s["trees"] += len({(x["case"], x["wiring"]) for x in r.rows})
        for k, n in verdict_counts(r.rows).items():
            s[k] += n
        s["seconds"] = round(s["seconds"] + r.seconds, 2)
    return sorted(out.values(), key=lambda s: s["node"])
