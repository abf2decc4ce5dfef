"""``goldens replay`` and ``goldens report``: select the trees (``goldens.selection``), judge each on the backend
(``goldens.verdicts``), print the table, keep the actual outputs (``--keep-actual``), and write the forms asked
for (``goldens.formats``: JSON, JUnit; ``goldens.report``: HTML). ``--devices`` hands the trees to one worker per
device (``goldens.devices``). Exit codes: 0 pass, 1 an output out of bound, 2 store or usage (stale trees
refused, a tree unreadable), 3 the backend raised or nothing ran, 130 interrupted.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from goldens.catalog import select_wirings
from goldens.console import console, err
from goldens.errors import BackendFailure, GoldenStoreError
from goldens.formats import emit_json, write_junit
from goldens.selection import backend_of, reaching, tree_items
from goldens.verdicts import STYLES, Verdicts, judge


def cmd_report(args) -> int:
    args.report = args.out
    return cmd_replay(args)


_INTERRUPTED = threading.Event()


def _on_sigint(signum, frame):  # the first Ctrl-C ends the replay after the tree in hand; the second at once
    if _INTERRUPTED.is_set():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        raise KeyboardInterrupt
    _INTERRUPTED.set()
    err.print("\n[yellow]Ctrl-C: stopping after the tree in hand (again to stop now)[/]", highlight=False)


def cmd_replay(args) -> int:
    _INTERRUPTED.clear()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        return _cmd_replay(args)
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _cmd_replay(args) -> int:
    from goldens.store import GoldenStore

    if getattr(args, "devices", None) or getattr(args, "cluster", None):
        return _replay_distributed(args)
    backend = backend_of(args)
    if backend is not None and backend.unavailable and not args.allow_unavailable:
        raise BackendFailure(f"backend {backend.name!r} (platform {backend.platform}) is unavailable here: "
                             f"{backend.unavailable}; nothing was replayed (--allow-unavailable accepts that)")
    store = GoldenStore(args.store)
    reader = store.reader(args.rev)
    backend, items, rebuilt = _selected(args, reader, backend)
    table = Table(title=escape(f"replay on backend {backend.name} ({backend.platform}) from {args.store}"
                               f"@{reader.snapshot[:12]}"))
    for col in ("case", "wiring", "output", "comparator", "verdict", "detail"):
        table.add_column(col, overflow="fold")

    def shown(r: dict) -> None:
        if not (args.quiet and r["verdict"] == "PASS"):
            table.add_row(r["case"], r["wiring"], r["output"], r["comparator"],
                          f"[{STYLES[r['verdict']]}]{r['verdict']}[/]", escape(r["detail"]))

    verdicts = Verdicts(on_row=shown)
    kept, digests, interrupted = _judge_all(args, store, reader, backend, items, rebuilt, verdicts)
    out = console if not args.json else Console(quiet=True)
    out.print(table)
    if interrupted:
        return 130
    c = verdicts.counts
    out.print(f"{c['failed_outputs']} failed output(s), {c['errors']} tree(s) with a backend error, {c['skipped']} "
              f"skipped tree(s), {c['stale']} stale tree(s) refused")
    if args.keep_actual and kept:
        from goldens import trees

        result = trees.keep_actual(store, backend, reader.snapshot, kept, verdicts.by_tree(), digests,
                                   run_id=getattr(args, "run_id", None))
        out.print(f"kept the actual outputs of {len(kept)} tree(s) under {trees.ACTUAL_ROOT}/ "
                  f"(snapshot {result.snapshot or 'unchanged'})")
    code, why = verdicts.exit_code(rev=args.rev, allow_unavailable=args.allow_unavailable)
    for line in why.splitlines():
        label, _, rest = line.partition(": ")
        err.print(f"[bold red]{label}:[/] {escape(rest)}", highlight=False, soft_wrap=True)
    _write_forms(args, reader, backend, verdicts, code)
    return code


def _selected(args, reader, backend):
    """(backend, the (case, wiring) pairs to replay, those of them rebuilt from a kept run): the named or recorded
    trees, those reaching --operator; for --backend recorded[:SOURCE], the backend is built from the store and the
    kept runs imported without their tree (goldens import-kept) join the rest."""
    from goldens import trees

    rebuilt: list = []
    if backend is None:  # --backend recorded[:SOURCE]: a device's kept outputs, judged again
        from goldens.recorded import rebuilt_items, recorded_backend

        if args.keep_actual:
            raise GoldenStoreError("--keep-actual keeps a device run's outputs; --backend recorded runs nothing")
        backend = recorded_backend(reader, args.backend)
        rebuilt = [(c, w) for c, w in rebuilt_items(reader, backend.source)
                   if (not args.cases or c in args.cases) and w in select_wirings(args.wiring)]
    names = [c for c in args.cases if c not in {c for c, _w in rebuilt}]
    if names or not rebuilt:
        items = tree_items(names, args.wiring, reader=reader)
    else:  # only imported runs named, or no tree in the store beside them
        items = tree_items(names, args.wiring, reader=reader) if trees.recorded_cases(reader) and not args.cases \
            else []
    items += rebuilt
    if args.operator:
        items = reaching(reader, items, args.operator)
    return backend, items, rebuilt


def _judge_all(args, store, reader, backend, items, rebuilt, verdicts: Verdicts):
    """Judge every tree in turn into ``verdicts``; (kept actual outputs, their inputs' digests, interrupted)."""
    kept: dict = {}
    digests: dict = {}
    history = None
    progress = Progress(console=err, transient=True, disable=len(items) < 2)
    task = progress.add_task("replaying", total=len(items))
    progress.start()
    try:
        for done, (case, wiring) in enumerate(items):
            if _INTERRUPTED.is_set():
                err.print(f"[bold red]interrupted[/] (Ctrl-C) after {done} of {len(items)} tree(s): the rows so far "
                          "are below; nothing was committed", highlight=False, soft_wrap=True)
                return kept, digests, True
            progress.advance(task)
            tree = _load(reader, backend, case, wiring, rebuilt, verdicts, single=len(items) == 1,
                         verbose=getattr(args, "verbose", False))
            judged = None if tree is None else _judge_one(args, tree, case, wiring, backend, verdicts)
            if judged is None:
                continue
            if args.keep_actual:
                from goldens.recorded import inputs_digest

                digests[(case, wiring)] = inputs_digest(tree.inputs)
            kept[(case, wiring)] = judged.actual
            if args.report:
                from goldens import report

                history = history or report.History(store)
                verdicts.reported.append(report.tree_report(history, tree, judged.actual, judged.results))
            verdicts.outputs(case, wiring, judged, tree.record.comparators)
    finally:
        progress.stop()
    return kept, digests, False


def _load(reader, backend, case, wiring, rebuilt, verdicts: Verdicts, *, single: bool, verbose: bool = False):
    """The tree of (case, wiring), or None with its row (a kept run that cannot be rebuilt: SKIP; a reference that
    raises on it: ERROR; a tree that cannot be read: ERROR, unless it is the only one asked for)."""
    from contracts.operators import Unsupported
    from goldens import trees

    if (case, wiring) in rebuilt:
        from goldens.recorded import rebuild_tree

        try:
            return rebuild_tree(reader, backend.source, case, wiring)
        except Unsupported as exc:
            verdicts.tree(case, wiring, "SKIP", str(exc), count="skipped")
            return None
    try:
        return trees.load_tree(reader, case, wiring)
    except BackendFailure as exc:  # the reference fails on this tree: an ERROR row, the others still run
        detail = str(exc)
        if verbose and exc.__cause__ is not None:  # the traceback the closing line promises
            import traceback

            detail += "\n" + "".join(traceback.format_exception(exc.__cause__)).rstrip()
        verdicts.tree(case, wiring, "ERROR", detail, count="errors")
    except GoldenStoreError as exc:  # this tree cannot be read or judged: its row, the others still run
        if single:
            raise
        verdicts.tree(case, wiring, "ERROR", f"unreadable tree: {exc}", count="unreadable")
    return None


def _judge_one(args, tree, case, wiring, backend, verdicts: Verdicts):
    """The judged tree, or None when it did not run (its STALE, SKIP or ERROR row recorded)."""
    if tree.stale and args.allow_stale:
        err.print(f"[bold red]WARNING: {case}/{wiring} is STALE (recorded with fingerprint "
                  f"{tree.record.fingerprint}); replaying anyway because of --allow-stale. Its expected outputs "
                  "do not reflect the current reference.[/]")
    judged = judge(tree, backend, allow_stale=args.allow_stale, verbose=args.verbose, stale_detail=lambda t: (
        stale_advice(t) if args.rev is None else
        f"recorded at {args.rev} with an older reference: replay it with --allow-stale (regen rewrites main, not "
        "an old revision)"))
    if judged.verdict in ("STALE", "SKIP", "ERROR"):
        verdicts.tree(case, wiring, judged.verdict, judged.detail,
                      count={"STALE": "stale", "SKIP": "skipped", "ERROR": "errors"}[judged.verdict])
        return None
    return judged


def _write_forms(args, reader, backend, verdicts: Verdicts, code: int) -> None:
    """--report (HTML), --json and --junit, each with the run's exit code."""
    summary = verdicts.summary()
    if args.report:
        from goldens import report

        page = report.write(args.report, f"goldens replay on {backend.name} ({backend.platform}) of {args.store}"
                            f"@{reader.snapshot[:12]}", verdicts.reported, {**summary, "exit_code": code})
        err.print(f"report: {page}")
    document = {"store": str(args.store), "snapshot": reader.snapshot, "backend": backend.name,
                "platform": backend.platform, "devices": list(getattr(backend, "devices", ())),
                "rows": verdicts.rows, "summary": summary, "exit_code": code}
    if args.json:
        emit_json(document)
    if args.junit:
        write_junit(Path(args.junit), document)


def _replay_distributed(args) -> int:
    """``goldens replay --devices IDS`` (goldens.devices: one worker per id on this host) or ``--cluster ray``
    (goldens.cluster: one Ray task per case over a cluster's nodes): the same tasks, one table with the node and
    device of each row, then a per-device (or per-node) summary. Kept outputs go in under one run id."""
    import uuid

    from goldens import devices
    from goldens.store import GoldenStore

    cluster = getattr(args, "cluster", None)
    ids = devices.parse_devices(args.devices) if args.devices else []
    option = "--cluster" if cluster else "--devices"
    if cluster and args.devices:
        raise GoldenStoreError("--cluster schedules every case itself (devices from Ray's resources): not with "
                               "--devices")
    for flag, given in (("--device", args.device), ("--report", args.report),
                        ("--backend recorded", args.backend.startswith("recorded"))):
        if given:
            raise GoldenStoreError(f"{option} runs its own tasks ({'shares of the cases' if cluster else 'one per device'}): "
                                   f"it does not combine with {flag} "
                                   + ("(each task is given its own --device)" if flag == "--device" else
                                      f"(replay without {option} for it)"))
    if not cluster:  # the backend once here, on all the ids: a backend that cannot take them, or is unavailable,
        # is one line before any worker starts (on a cluster each node checks its own)
        probe = backend_of(argparse.Namespace(**{**vars(args), "device": ",".join(map(str, ids))}))
        if probe is not None and probe.unavailable and not args.allow_unavailable:
            raise BackendFailure(f"backend {probe.name!r} (platform {probe.platform}) is unavailable here: "
                                 f"{probe.unavailable}; nothing was replayed (--allow-unavailable accepts that)")
    store = GoldenStore(args.store)
    reader = store.reader(args.rev)
    items = tree_items(list(args.cases), args.wiring, reader=reader)
    if args.operator:
        items = reaching(reader, items, args.operator)
    run_id = uuid.uuid4().hex[:16] if args.keep_actual else None
    if cluster:
        from goldens import cluster as engine

        runs, rows = engine.run(args, items, reader, run_id=run_id)
    else:
        engine = None
        runs, rows = devices.run(args, items, reader, ids, run_id=run_id)
    code = devices.exit_code(runs)
    out = console if not args.json else Console(quiet=True)
    where = f"the Ray cluster {cluster}" if cluster else f"devices {ids}"
    table = Table(title=escape(f"replay on backend {args.backend_module or args.backend} over {where} from "
                               f"{args.store}@{reader.snapshot[:12]}"))
    for col in (("node",) if cluster else ()) + ("device", "case", "wiring", "output", "comparator", "verdict",
                                                  "detail"):
        table.add_column(col, overflow="fold")
    for r in rows:
        if not (args.quiet and r["verdict"] == "PASS"):
            table.add_row(*((r["node"],) if cluster else ()), str(r["device"] if r["device"] is not None else "-"),
                          r["case"], r["wiring"], r["output"], r["comparator"],
                          f"[{STYLES[r['verdict']]}]{r['verdict']}[/]", escape(r["detail"]))
    out.print(table)
    per_device = []
    for r in runs:
        s = (r.document or {}).get("summary", {})
        per_device.append({"device": r.device, "node": r.node, "cases": len(r.cases), "trees": s.get("ran", 0),
                           **devices.verdict_counts(r.rows), "skipped": s.get("skipped", 0),
                           "stale": s.get("stale", 0), "exit": r.code, "seconds": round(r.seconds, 2),
                           "note": r.error, "backend_devices": list((r.document or {}).get("devices", []))})
    summaries = {}
    if engine is not None:
        summaries["per node"] = engine.by_node(runs)
    summaries["per device" if not cluster else "per task"] = per_device
    for title, got in summaries.items():
        summary = Table(title=title)
        cols = [c for c in (got[0] if got else {}) if c != "backend_devices"]
        for col in cols:
            summary.add_column(col, overflow="fold")
        for row in got:
            summary.add_row(*(escape(str(row[c])) if row[c] is not None else "-" for c in cols))
        out.print(summary)
    kept = None
    if run_id:
        kept = _kept_under(GoldenStore(args.store), run_id)
        out.print(f"kept the actual outputs of {len(kept)} tree(s) under run {run_id}")
    document = {"store": str(args.store), "snapshot": reader.snapshot, "backend": args.backend_module or args.backend,
                "platform": args.platform, "devices": ids, "cluster": cluster, "rows": rows,
                "per_device": per_device, **({"per_node": summaries["per node"]} if cluster else {}),
                **({"run_id": run_id, "kept": kept} if run_id else {}), "exit_code": code}
    if args.json:
        emit_json(document)
    if args.junit:
        write_junit(Path(args.junit), document)
    return code


def _kept_under(store, run_id: str) -> list[str]:
    """The trees (``<source>/<case>/<wiring>``) whose kept run in the branch head is this run's."""
    from goldens.recorded import kept_runs, sources

    reader = store.reader()
    return [f"{source}/{case}/{wiring}" for source in sources(reader)
            for case, wiring, attrs in kept_runs(reader, source) if attrs.get("run_id") == run_id]


def stale_advice(tree) -> str:
    """What changed, and whether regenerating is safe: the current reference's outputs on the stored inputs
    judged against the stored ones by the tree's own comparators (goldens.trees.classify_change)."""
    from goldens import trees

    what = tree.moved_text()  # "changed X", "now reaches Y", "no longer reaches Z"
    try:
        change = trees.classify_change(tree, trees.reference_outputs(tree))
    except BackendFailure as exc:
        return f"{what}; and the current reference raises on it ({exc}): fix the reference, regen cannot run"
    if change.kind == "none":
        return f"{what}; no output moves: `goldens regen {tree.case.name}` only refreshes its fingerprint"
    if change.kind == "rounding":
        return (f"{what}; {change.detail}: a rounding change, `goldens regen {tree.case.name}` is safe (or "
                "--allow-stale)")
    return (f"{what}; OUTPUTS MOVE PAST THEIR COMPARATORS: {change.detail}. A reference bug looks exactly like "
            f"this: check it; only a rule changed on purpose is recorded, with `goldens regen {tree.case.name} "
            "--accept-moved -m REASON`")
