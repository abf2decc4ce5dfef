"""Which upstream kernels compile and pass on a platform: each model module's own driver, run as upstream runs it.

    python -m backends.upstream.survey --pypto-lib DIR [--platform a5sim] [--timeout 1800] [--results FILE]
        [--cluster ray[://HOST:PORT]] [MODULE ...]

Every ``models/<folder>/<module>.py`` of the checkout whose ``__main__`` hands an entry to ``golden.run_jit`` is run
as ``python <module>.py -p PLATFORM`` in the upstream Python (``$PTO_UPSTREAM_PYTHON``, e.g. the a5sim
toolchain's wrapper), in a work folder of its own, with one thread for its Torch goldens. The driver compiles the
entry at the model's geometry, generates upstream's inputs, runs the kernel and validates against upstream's own
golden with upstream's own comparators. This survey only reads what the driver printed and how it ended:

- ``PASS``: the driver's validation passed;
- ``FAIL validate``: the kernel ran and upstream's comparator refused its outputs (the comparator's message is kept);
- ``FAIL <stage>``: the driver stopped in ``compile``, ``generate inputs``, ``runtime`` or ``compute golden``
  (the stage the runner had started and not finished; the first error line is kept);
- ``FAIL before any stage``: it stopped before the runner started a stage (an import or argument error);
- ``NOT OFFERED``: the driver's ``-p`` refuses the platform (its argparse choices);
- ``UNJUDGED``: exit 0 from a driver that would exit 0 on a failed result too (a ``run_jit`` result its
  ``__main__`` never ends the process on: :func:`unchecked_results`, upstream_checks CH-21);
- ``TIMEOUT``: still running after ``--timeout`` seconds (the process group is killed);
- ``LOST``: with ``--cluster``, the node(s) running it died more often than Ray retries a task.

One JSON object per module is appended to ``--results`` as each ends, so a long survey can be stopped and
resumed (``--resume`` skips modules already there). Nothing is judged by this project here: the harness's own
verdicts come from ``goldens replay --backend pypto``. Exit 0 when every module ran to a verdict line, 2 on bad
usage, 3 when the upstream Python cannot start.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from backends.upstream.python import PYTHON_ENV, worker_python

_STAGE = re.compile(r"^\[RUN\] (compile|generate inputs|runtime|compute golden|validate|benchmark) (\.\.\.|done)")
_ERROR = re.compile(r"(error:|Error:|Error\b|Exception|FAIL|Traceback|Aborted|Segmentation)")


@dataclass
class Outcome:
    module: str
    status: str  # PASS, FAIL <stage>, TIMEOUT
    seconds: float
    detail: str
    exit_code: int | None
    node: str = ""  # where it ran, on a --cluster survey


def drivers(root: Path, folder: str) -> list[str]:
    """The modules of ``models/<folder>`` whose ``__main__`` runs an entry through ``golden.run_jit``."""
    out = []
    for p in sorted((root / "models" / folder).glob("*.py")):
        text = p.read_text(errors="replace")
        if '__name__ == "__main__"' in text and re.search(r"\brun_jit\(", text):
            out.append(p.stem)
    return out


def _exits_nonzero(stmts: list) -> bool:
    """A statement list that ends the process with a non-zero status: ``raise SystemExit`` with no code, a
    non-zero int or a message, or ``sys.exit`` / ``exit`` the same way."""
    import ast

    for node in (n for s in stmts for n in ast.walk(s)):
        call = None
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc
            if isinstance(exc, ast.Name) and exc.id == "SystemExit":
                return True
            if isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) and exc.func.id == "SystemExit":
                call = exc
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.exit", "exit"):
            call = node
        if call is not None:
            code = call.args[0] if call.args else None
            if code is None or not isinstance(code, ast.Constant) or code.value not in (0, None, False):
                return True
    return False


def unchecked_results(source: str) -> list[tuple[int, str]]:
    """(line, what) of each ``golden.run`` / ``run_jit`` result of a driver module that does not end the process
    with a non-zero status when it has not passed -- the survey reads a driver's exit status as its verdict
    (upstream_checks CH-21). A result is checked by a later ``if not V.passed:`` whose body exits non-zero
    (:func:`_exits_nonzero`); a call whose result is not bound to a name is never checked."""
    import ast

    tree = ast.parse(source)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id in ("run", "run_jit")]
    bound = {id(n.value): n for n in ast.walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1
             and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Call)}
    guards = [n for n in ast.walk(tree) if isinstance(n, ast.If) and isinstance(n.test, ast.UnaryOp)
              and isinstance(n.test.op, ast.Not) and isinstance(n.test.operand, ast.Attribute)
              and n.test.operand.attr == "passed" and isinstance(n.test.operand.value, ast.Name)
              and _exits_nonzero(n.body)]
    out = []
    for call in calls:
        assign = bound.get(id(call))
        if assign is None:
            out.append((call.lineno, f"{call.func.id}(...) result not bound to a name"))
            continue
        name = assign.targets[0].id
        if not any(g.test.operand.value.id == name and g.lineno > assign.lineno for g in guards):
            out.append((assign.lineno, f"{name} = {call.func.id}(...) never ends the process when not passed"))
    return out


def classify(stdout: str, stderr: str, code: int | None) -> tuple[str, str]:
    """(status, detail) from a driver's output: the stage the runner last started (it prints "done" for a stage
    that raised too), and the most telling error line."""
    stage = None
    for line in stdout.splitlines():
        m = _STAGE.match(line.strip())
        if m and m.group(2) == "...":
            stage = m.group(1)
    lines = [ln.strip() for ln in (stdout + "\n" + stderr).splitlines() if ln.strip()]
    if code == 2 and "invalid choice" in stderr and "-p/--platform" in stderr:
        return "NOT OFFERED", [ln for ln in lines if "invalid choice" in ln][0][:400]
    if code == 0:
        verdicts = [ln for ln in lines if ln.startswith("[RUN] PASS")]
        return "PASS", verdicts[-1] if verdicts else "exit 0"
    # the most telling line: pypto's per-function compile failure, else the last exception line of a traceback,
    # else the first error-looking line, else the last line
    compile_fail = [ln for ln in lines if ln.startswith("Failed to compile function")]
    last_exc = [ln for ln in lines if re.match(r"^[A-Za-z_.]+(Error|Exception|Interrupt)\b", ln)]
    first_err = [ln for ln in lines if _ERROR.search(ln) and not ln.startswith("[RUN]")]
    pick = compile_fail or last_exc[-1:] or first_err[:1] or lines[-1:] or [""]
    return f"FAIL {stage or 'before any stage'}", pick[0][:400]


def run_one(python: list[str], root: Path, folder: str, module: str, platform: str, timeout: float,
            log_dir: Path | None) -> Outcome:
    env = dict(os.environ, PYTHONPATH=str(root), PYPTO_GOLDEN_NUM_THREADS="1", OMP_NUM_THREADS="1")
    workdir = tempfile.mkdtemp(prefix=f"pto-survey-{module}-")
    script = str(root / "models" / folder / f"{module}.py")
    start = time.monotonic()
    proc = subprocess.Popen([*python, script, "-p", platform], cwd=workdir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        status, detail = classify(out, err, proc.returncode)
        code = proc.returncode
        unchecked = unchecked_results(Path(script).read_text(errors="replace")) if status == "PASS" else []
        if unchecked:  # exit 0 is no verdict from a driver that exits 0 on a failed result too
            status, detail = "UNJUDGED", f"exit 0, but line {unchecked[0][0]}: {unchecked[0][1]}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        status, detail, code = "TIMEOUT", f"still running after {timeout:.0f} s", None
    seconds = time.monotonic() - start
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"{module}.log").write_text(out + "\n--- stderr ---\n" + err)
    return Outcome(module, status, round(seconds, 1), detail, code)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m backends.upstream.survey", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--pypto-lib", required=True, type=Path, help="a checkout of hw-native-sys/pypto-lib")
    ap.add_argument("--folder", default="deepseek_v4_pro", help="the model folder under models/ (default %(default)s)")
    ap.add_argument("--platform", default="a5sim", choices=("a5sim", "a5", "a2a3sim", "a2a3"))
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per module (default %(default)s)")
    ap.add_argument("--results", type=Path, default=None, help="append one JSON line per module here")
    ap.add_argument("--logs", type=Path, default=None, help="keep each driver's full output in this folder")
    ap.add_argument("--resume", action="store_true", help="skip modules already in --results")
    ap.add_argument("--list", action="store_true", help="list the modules that would run, then stop")
    ap.add_argument("--cluster", default=None, metavar="ray[://HOST:PORT]",
                    help="run the modules as tasks on a Ray cluster (as `goldens replay --cluster`): each asks for "
                         "--task-cpus CPUs, a module whose node dies runs again elsewhere; every node needs the "
                         "checkout and $PTO_UPSTREAM_PYTHON at the same paths")
    ap.add_argument("--task-cpus", type=float, default=1.0, help="CPUs one --cluster task asks for (default 1)")
    ap.add_argument("modules", nargs="*", help="module names (default: every driver of the folder)")
    args = ap.parse_args(argv)
    root = args.pypto_lib.resolve()
    if not (root / "models" / args.folder).is_dir():
        print(f"survey: {root / 'models' / args.folder} is not a folder (is --pypto-lib a pypto-lib checkout?)",
              file=sys.stderr)
        return 2
    found = drivers(root, args.folder)
    unknown = [m for m in args.modules if m not in found]
    if unknown:
        print(f"survey: no driver module {', '.join(unknown)} in models/{args.folder} "
              f"(drivers: {', '.join(found)})", file=sys.stderr)
        return 2
    chosen = args.modules or found
    if args.resume and args.results and args.results.exists():
        done = {json.loads(ln)["module"] for ln in args.results.read_text().splitlines() if ln.strip()}
        chosen = [m for m in chosen if m not in done]
    if args.list:
        print("\n".join(chosen))
        return 0
    python = worker_python()
    try:
        probe = subprocess.run([*python, "-c", "import pypto"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"survey: the upstream Python {python} cannot start ({exc}); set ${PYTHON_ENV}", file=sys.stderr)
        return 3
    if probe.returncode != 0:
        tail = (probe.stderr.strip().splitlines() or ["?"])[-1]
        print(f"survey: the upstream Python {' '.join(python)} cannot import pypto ({tail}); set ${PYTHON_ENV} to "
              "the a5sim toolchain's PREFIX/bin/python (scripts/a5sim-setup.sh)", file=sys.stderr)
        return 3
    print(f"{'module':34} {'status':22} {'seconds':>8}  detail", flush=True)
    for o in (_on_cluster(args, python, root, chosen) if args.cluster else
              (run_one(python, root, args.folder, m, args.platform, args.timeout, args.logs) for m in chosen)):
        where = f" [{o.node}]" if o.node else ""
        print(f"{o.module:34} {o.status:22} {o.seconds:8.1f}  {o.detail[:160]}{where}", flush=True)
        if args.results:
            with args.results.open("a") as f:
                f.write(json.dumps(asdict(o)) + "\n")
    return 0


def _survey_task(python, root, folder, module, platform, timeout, log_dir) -> Outcome:
    from backends.cluster import node_label

    o = run_one(python, root, folder, module, platform, timeout, log_dir)
    o.node = node_label()
    return o


def _on_cluster(args, python, root: Path, chosen: list[str]):
    """The modules as Ray tasks (backends.cluster's connection and retry rules), yielded as each ends."""
    from backends.cluster import MAX_RETRIES, ClusterUnreachable, ClusterUsage, connect, finished

    try:
        ray = connect(args.cluster)
    except (ClusterUsage, ClusterUnreachable) as exc:
        print(f"survey: {exc}", file=sys.stderr)
        raise SystemExit(2 if isinstance(exc, ClusterUsage) else 3) from None
    remote = ray.remote(num_cpus=args.task_cpus, max_retries=MAX_RETRIES, retry_exceptions=False)(_survey_task)
    logs = args.logs.resolve() if args.logs else None
    pending = {remote.remote(python, root, args.folder, m, args.platform, args.timeout, logs): m for m in chosen}
    try:
        for module, outcome, lost in finished(ray, pending):
            yield outcome if lost is None else Outcome(module, "LOST", 0.0, lost, None)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
