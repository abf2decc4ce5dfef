"""``goldens``: record, replay, regenerate, inspect and move V4.1 replay trees.

Exit codes: 0 pass, 1 contract failure (a replayed output out of bound), 2 usage or store error, 3 backend error."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import sys
from pathlib import Path

import icechunk
from rich.markup import escape
from rich.table import Table

from goldens.catalog import select_wirings
from goldens.console import DEFAULT_STORE, _num, console, err
from goldens.errors import BackendFailure, GoldenStoreError, RuleChange
from goldens.replay import cmd_replay, cmd_report
from goldens.selection import check_case_name, tree_items
from goldens.store_format import damaged


def _int_arg(low: int, high: int | None = None, *, expected: str):
    """An argparse type: an integer in [low, high), else the usage error "<expected>, got <text>"."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value >= high):
            raise argparse.ArgumentTypeError(f"{expected}, got {text!r}")
        return value
    return parse


_positive_int = _int_arg(1, expected="expected a positive integer")


_seed = _int_arg(0, 2**62, expected="a seed is in [0, 2^62)")


def cmd_record(args) -> int:
    from goldens import trees
    from goldens.store import GoldenStore

    if args.source == "upstream":
        return _record_from_upstream(args)
    if args.pypto_lib is not None:
        raise GoldenStoreError("--pypto-lib applies to record --from upstream")
    if args.geometry:
        _refuse_sample_store(args.store, f"--geometry {args.geometry}")
        from goldens.cases import geometry_cases

        at = geometry_cases(args.geometry)
        other = [c for c in args.cases if c not in at]
        if other:
            raise GoldenStoreError(f"--geometry {args.geometry}: {other[0]} is not a case at that geometry (its "
                                   f"cases: {', '.join(at[:6])}{', ...' if len(at) > 6 else ''})")
        args.cases = args.cases or at
    items = tree_items(args.cases, args.wiring)
    with console.status(f"recording {len(items)} tree(s)"):
        result = trees.record(GoldenStore(args.store), items, args.seed, force=args.force)
    table = Table(title=f"record -> {args.store}")
    for col in ("case", "wiring", "arrays written"):
        table.add_column(col)
    for case, wiring in items:
        n = sum(1 for p in result.written if p.startswith(f"{case}/{wiring}/"))
        table.add_row(case, wiring, str(n))
    console.print(table)
    console.print(f"snapshot {result.snapshot or '(unchanged, no commit)'}; {len(result.unchanged)} arrays unchanged")
    return 0


def _refuse_sample_store(store: str, what: str) -> None:
    """Trees at a model's geometry hold hundreds of MB: never the sample store committed with the project."""
    from goldens.store_format import Location

    location = Location.parse(store)
    sample = (Path(__file__).resolve().parents[1] / "artifacts" / "store").resolve()
    if not location.remote and Path(location.path).resolve() == sample:
        raise GoldenStoreError(f"{what}: trees at a model's geometry hold hundreds of MB and never go into the sample "
                               f"store {store}; name a store of your own: --store DIR or --store s3://BUCKET/PREFIX")


def _record_from_upstream(args) -> int:
    from backends import get_backend
    from contracts.operators import BackendError
    from goldens import trees
    from goldens.cases import get_case
    from goldens.store import GoldenStore

    if not args.cases:
        raise GoldenStoreError("record --from upstream: name the case(s) to record (goldens cases lists them; the "
                               "upstream backend covers the operators its adapters bind)")
    try:
        backend = get_backend("upstream", pypto_lib=args.pypto_lib, model=args.model)
    except BackendError as exc:
        raise BackendFailure(str(exc)) from exc
    if backend.unavailable:
        raise BackendFailure(f"backend 'upstream' is unavailable: {backend.unavailable}")
    if backend.provenance.get("dirty"):
        console.print(f"warning: the checkout has local changes; the trees name commit "
                      f"{backend.provenance['commit'][:12]} with dirty=true")
    items = tree_items(args.cases, args.wiring)
    with console.status(f"recording {len(items)} tree(s) from upstream"):
        names, result = trees.record_from_upstream(GoldenStore(args.store), backend, items, args.seed,
                                                   force=args.force)
    table = Table(title=f"record --from upstream ({backend.provenance['commit'][:12]}) -> {args.store}")
    for col in ("tree", "wiring", "upstream golden", "variants", "arrays written"):
        table.add_column(col)
    for name, (_base, wiring) in zip(names, items, strict=True):
        n = sum(1 for p in result.written if p.startswith(f"{name}/{wiring}/"))
        u = get_case(name).upstream
        table.add_row(name, wiring, ", ".join(u["goldens"]), str(u["variants"] or "-"), str(n))
    console.print(table)
    console.print(f"snapshot {result.snapshot or '(unchanged, no commit)'}; {len(result.unchanged)} arrays unchanged")
    return 0


def _emit(document: dict) -> None:
    sys.stdout.write(json.dumps(document, indent=2, default=str) + "\n")


def _delta(d) -> dict:
    return {"output": d.name, "elements_changed": d.elements_changed, "elements": d.elements,
            "max_abs": None if math.isnan(d.max_abs) else d.max_abs,
            "mean_abs": None if math.isnan(d.mean_abs) else d.mean_abs,
            "max_rel": None if math.isnan(d.max_rel) else d.max_rel, "rows_affected": d.rows_affected}


def cmd_regen(args) -> int:
    from goldens import trees
    from goldens.cases import get_case
    from goldens.store import GoldenStore

    if args.accept_rule_change and not args.dry_run and not (args.message or "").strip():
        raise GoldenStoreError("regen --accept-moved records outputs that move past their comparators: say why with "
                         "-m REASON (kept in the snapshot's message)")
    store = GoldenStore(args.store)
    items = tree_items(args.cases, args.wiring, reader=store.reader())
    if not args.cases:  # trees recorded from upstream hold upstream's numbers: never regenerated from ours
        skipped = sorted({c for c, _w in items if get_case(c).upstream})
        items = [(c, w) for c, w in items if not get_case(c).upstream]
        if skipped and not args.json:
            console.print(f"not regenerated (upstream's numbers; `goldens record --from upstream` refreshes them): "
                          f"{', '.join(skipped)}")
        if not items:
            raise GoldenStoreError("nothing to regenerate: every recorded tree holds upstream's numbers")
    report, result = trees.regen(store, items, dry_run=args.dry_run, reason=args.message,
                                 accept_rule_change=args.accept_rule_change)
    beyond = [(c, w, ch) for c, w, _ds, ch in report if ch.kind == "beyond"]
    if args.json:
        _emit({"dry_run": args.dry_run, "snapshot": None if result is None else result.snapshot,
               "trees": [{"case": c, "wiring": w, "change": ch.kind, "change_detail": ch.detail,
                          "deltas": [{**_delta(d), "change": ch.of(d.name)} for d in ds]} for c, w, ds, ch in report]})
        return 1 if beyond and args.dry_run and not args.accept_rule_change else 0
    table = Table(title="regen (dry run: nothing committed)" if args.dry_run else "regen")
    for col in ("case", "wiring", "output", "elements changed", "max abs", "mean abs", "max rel", "rows affected",
                "change"):
        table.add_column(col)
    kinds = {"none": "", "rounding": "[green]rounding[/]", "beyond": "[bold red]PAST ITS COMPARATOR[/]"}
    for case, wiring, deltas, change in report:
        if not deltas:
            table.add_row(case, wiring, "(no output changed)", "0", "", "", "", "", "")
        for d in deltas:
            table.add_row(case, wiring, d.name, f"{d.elements_changed}/{d.elements}", _num(d.max_abs),
                          _num(d.mean_abs), _num(d.max_rel), str(d.rows_affected), kinds[change.of(d.name)])
    console.print(table)
    if beyond and args.accept_rule_change and not args.dry_run:  # what was recorded past its comparators, all of it
        for c, w, ch in beyond:
            console.print(f"[bold yellow]accepted past its comparators[/] {c}/{w}: {escape(ch.detail)}",
                          highlight=False, soft_wrap=True)
        console.print(f"reason recorded: {escape(args.message)}", highlight=False, soft_wrap=True)
    elif beyond:
        shown = "; ".join(f"{c}/{w}: {escape(ch.detail)}" for c, w, ch in beyond[:3])
        say = err.print if args.dry_run and not args.accept_rule_change else console.print
        say(f"[bold red]{len(beyond)} tree(s) move past their comparators[/] (a rounding change does not; a reference "
            f"bug does): {shown}" + ("" if args.accept_rule_change else
                                     ". Check the reference; `goldens regen --accept-moved -m REASON` records a "
                                     "rule changed on purpose"), highlight=False, soft_wrap=True)
        if args.dry_run and not args.accept_rule_change:
            return 1
    if result is not None:
        console.print(f"snapshot {result.snapshot or '(unchanged, no commit)'}; "
                      f"{len([p for p in result.written if '/out/' in p])} output arrays rewritten")
        if result.tag_error:
            err.print(f"[yellow]warning:[/] {escape(result.tag_error)}", highlight=False, soft_wrap=True)
    return 0


def cmd_log(args) -> int:
    from goldens.store import GoldenStore

    table = Table(title=f"log of {args.store}")
    for col in ("snapshot", "written (UTC)", "tags", "message"):
        table.add_column(col, overflow="fold")
    store = GoldenStore(args.store)
    for e in store.log()[: args.limit]:
        table.add_row(e.snapshot, e.written_at.strftime("%Y-%m-%d %H:%M:%S"), ", ".join(e.tags), e.message)
    console.print(table)
    bad = store.unreadable_tags()
    for name, why in bad:  # never hidden: its snapshot has lost the tag's protection from gc
        err.print(f"[bold red]error:[/] tag {escape(name)!r} cannot be read ({escape(why)}): the log above cannot "
                  "show it and its snapshot is not protected from gc (goldens gc refuses to run until the ref is "
                  "restored from a backup or the tag deleted)", highlight=False, soft_wrap=True)
    return 2 if bad else 0


def cmd_diff(args) -> int:
    from goldens import trees
    from goldens.store import GoldenStore

    rows = trees.diff_revisions(GoldenStore(args.store), args.rev_a, args.rev_b)
    if args.json:
        _emit({"rev_a": args.rev_a, "rev_b": args.rev_b,
               "arrays": [{"path": p, "change": k, "delta": None if d is None or isinstance(d, str) else _delta(d),
                           **({"detail": d} if isinstance(d, str) else {})} for p, k, d in rows]})
        return 0
    table = Table(title=f"diff {args.rev_a} -> {args.rev_b}")
    for col in ("array", "change", "elements changed", "max abs", "mean abs", "max rel", "rows"):
        table.add_column(col, overflow="fold")
    for path, kind, d in rows:
        if d is None:
            table.add_row(path, kind, "", "", "", "", "")
        elif isinstance(d, str):
            table.add_row(path, kind, escape(d), "", "", "", "")
        else:
            table.add_row(path, kind, f"{d.elements_changed}/{d.elements}", _num(d.max_abs), _num(d.mean_abs),
                          _num(d.max_rel), str(d.rows_affected))
    console.print(table)
    console.print(f"{sum(k != 'attrs' for _p, k, _d in rows)} array(s) and {sum(k == 'attrs' for _p, k, _d in rows)} "
                  "tree record(s) differ")
    return 0


def cmd_show(args) -> int:
    from goldens import trees
    from goldens.cases import cases, fingerprint
    from goldens.store import GoldenStore

    store = GoldenStore(args.store)
    if not args.case:
        table = Table(title="cases")
        for col in ("case", "operator", "wirings", "recorded", "description"):
            table.add_column(col, overflow="fold")
        reader = store.reader(args.rev) if store.exists() else None
        if args.json and reader is not None:
            _emit({"cases": [{"case": n, "operator": c.operator, "wirings": list(c.wirings),
                              "recorded": trees.recorded_wirings(reader, n), "description": c.description}
                             for n, c in sorted(cases().items())]})
            return 0
        for name, c in sorted(cases().items()):
            rec = ", ".join(trees.recorded_wirings(reader, name)) if reader else ""
            table.add_row(name, c.operator, ", ".join(c.wirings), rec, c.description)
        console.print(table)
        if reader is None:
            raise GoldenStoreError(f"no golden store at {args.store} (the cases above can be recorded with "
                                   "goldens record CASE)")
        return 0
    check_case_name(args.case)
    reader = store.reader(args.rev)
    if args.json:
        found = trees.recorded_wirings(reader, args.case)
        if not found:
            raise GoldenStoreError(f"case {args.case} has no recorded tree in {args.store}")
        docs = []
        for wiring in found:
            tree = trees.load_tree(reader, args.case, wiring)
            docs.append({**reader.group_attrs(f"{args.case}/{wiring}"), "stale": tree.stale,
                         "current_fingerprint": fingerprint(tree.case, set(tree.record.fingerprint_parts))})
        _emit({"case": args.case, "trees": docs})
        return 0
    for wiring in trees.recorded_wirings(reader, args.case) or [None]:
        if wiring is None:
            raise GoldenStoreError(f"case {args.case} has no recorded tree in {args.store}")
        tree = trees.load_tree(reader, args.case, wiring)
        r = tree.record
        state = f"[red]STALE: {escape(tree.stale_reason())}[/]" if tree.stale else "[green]current[/]"
        console.print(f"[bold]{r.case}/{r.wiring}[/] operator {r.operator}, preset {r.preset}, seed {r.seed}, "
                      f"source {r.source}")
        console.print(f"fingerprint {r.fingerprint} ({state}; current {fingerprint(tree.case, set(r.fingerprint_parts))}); rounding {r.rounding}; "
                      f"versions {r.versions}")
        table = Table()
        for col in ("#", "argument", "direction", "dtype", "shape", "comparator", "tolerances"):
            table.add_column(col)
        for i, a in enumerate(r.args):
            table.add_row(str(i), a.name, a.direction + (" (scalar)" if a.scalar else ""), a.dtype, str(list(a.shape)),
                          r.comparators.get(a.name, ""), str(r.tolerances.get(a.name, "")) if a.is_output else "")
        console.print(table)
    return 0


def doctor_report(store_spec: str, pypto_lib: str | None) -> list[tuple[str, str, str]]:
    """(state, piece, detail) rows: state is ok, MISSING (with what to do) or info."""
    import importlib.metadata as md

    rows: list[tuple[str, str, str]] = [("ok", "python", sys.version.split()[0])]
    for dist, want in (("torch", "==2.13.0 (CPU wheel)"), ("numpy", ""), ("zarr", ">=3.1,<4"),
                       ("icechunk", ">=1.1,<3"), ("hypothesis", ""), ("crc32c", ">=2.4")):
        try:
            rows.append(("ok", dist, md.version(dist) + (f" (want {want})" if want else "")))
        except md.PackageNotFoundError:
            rows.append(("MISSING", dist, f"not installed: bash scripts/run-tests.sh installs it ({want or 'any'})"))
    import tempfile

    from backends import pypto as pb
    from backends.upstream.backend import checkout_problems

    problems = checkout_problems(pypto_lib)  # every missing piece at once, each with what to do
    for piece, why in problems:
        rows.append(("MISSING", piece, why + "; only --backend pypto/upstream need it"))
    root = None
    if not problems:
        root, _why = pb.checkout(pypto_lib)
        rows.append(("ok", "pypto-lib checkout", f"{root} @ {pb.revision(root)}"))
    from backends.upstream.client import PYTHON_ENV, UpstreamError, worker, worker_python

    rows.append(("info", "worker python", " ".join(worker_python()) + (f" (${PYTHON_ENV})" if PYTHON_ENV in
                                                                         os.environ else " (this interpreter)")))
    # the toolchain is the worker's Python's, whatever the checkout: checked even without one -- first by one
    # import in that Python (no worker to start when it is missing), then through a worker on an empty folder
    probe = root or Path(tempfile.mkdtemp(prefix="pto-doctor-"))
    reason = None if root is not None else _quick_toolchain_reason(worker_python())
    reason = reason or pb.detect_toolchain(probe)
    if reason:
        rows.append(("MISSING", "pypto toolchain", reason + " (build it with scripts/a5sim-setup.sh --sources DIR "
                                                           f"and set {PYTHON_ENV}=PREFIX/bin/python; the PyPI "
                                                           "package named pypto is a different project)"))
    else:
        double = root is not None and (root / pb.TEST_DOUBLE_MARKER).exists()
        rows.append(("ok", "pypto toolchain", "pypto.language imports in the upstream worker"
                     + (" (TEST DOUBLE: tests/fake_upstream)" if double else "")))
        try:
            rows.extend((state, f"a5sim: {piece}", detail) for state, piece, detail in worker(probe).toolchain())
        except UpstreamError as exc:
            rows.append(("MISSING", "a5sim toolchain", str(exc)))
    from backends.pypto.table import BINDINGS

    bound = sorted(b.operator for b in BINDINGS.values() if b.status == "bound")
    rows.append(_compile_cache_row())
    rows.append(("info", "pypto bindings", f"{len(bound)}/{len(BINDINGS)} operators bound ({', '.join(bound)}); "
                                           "see docs/backends.md"))
    from goldens import trees
    from goldens.store import GoldenStore

    store = GoldenStore(store_spec)
    store.read_cache = None  # the store's own chunks: damage a read cache would hide is reported
    try:
        if not store.exists():
            rows.append(("MISSING", "golden store", f"no store at {store_spec}: `goldens record` creates one, or "
                                                    "restore artifacts/store from version control"))
            return rows
        reader = store.reader()
        items = [(c, w) for c in trees.recorded_cases(reader) for w in trees.recorded_wirings(reader, c)]
    except GoldenStoreError as exc:  # the store is there (exists() said so): it cannot be read
        rows.append(("DAMAGED", "golden store", str(exc)))
        return rows
    except icechunk.IcechunkError as exc:
        rows.append(("DAMAGED", "golden store", damaged(store_spec, exc)))
        return rows
    stale, unreadable, raising = [], [], []
    for c, w in items:  # one bad tree is that tree's problem, not a missing store
        try:
            if trees.load_tree(reader, c, w).stale:
                stale.append(f"{c}/{w}")
        except BackendFailure as exc:  # readable: the current reference raises on it (replay exits 3)
            raising.append(f"{exc}")
            with contextlib.suppress(Exception):
                if trees.staleness(reader, c, w):
                    stale.append(f"{c}/{w}")
        except GoldenStoreError as exc:
            unreadable.append(f"{exc}")
    rows.append(("ok", "golden store", f"{store_spec} @ {reader.snapshot[:12]}: {len(items)} tree(s)"))
    if store.damaged_snapshots:  # main reads; the history does not (a write, log, or that revision refuses)
        first = next(iter(store.damaged_snapshots))
        rows.append(("DAMAGED", "snapshot history", f"{len(store.damaged_snapshots)} older snapshot(s) damaged "
                                                     f"(e.g. {first}): main replays, but record, regen, gc, log and "
                                                     "--rev on them refuse; restore the store directory from version "
                                                     "control or a backup"))
    try:
        problems = store.history_problems()
    except (GoldenStoreError, icechunk.IcechunkError) as exc:
        problems = [str(exc)]
    if problems:  # main replays; log, --rev, record, regen and gc need these
        rows.append(("DAMAGED", "tags and history", f"{problems[0]}" + (f" (+{len(problems) - 1} more)"
                                                                         if len(problems) > 1 else "")
                     + ": main replays, but goldens log, gc and a read of that revision refuse; restore the store "
                       "directory from version control or a backup"))
    if raising:
        rows.append(("ERROR", "current reference", f"raises on {len(raising)} of {len(items)} tree(s), which are "
                                                   f"readable (goldens replay exits 3 for them): {raising[0]}"
                                                   + (f" (+{len(raising) - 1} more)" if len(raising) > 1 else "")))
    if unreadable:
        rows.append(("DAMAGED", "readable trees", f"{len(unreadable)} of {len(items)} cannot be read or judged "
                                                  f"(goldens replay gives them ERROR rows, exit 2): {unreadable[0]}"
                                                  + (f" (+{len(unreadable) - 1} more)" if len(unreadable) > 1 else "")))
    rows.append(("ok" if not stale else "MISSING", "fresh trees",
                 "none stale" if not stale else f"{len(stale)} stale ({', '.join(stale[:4])}...): goldens replay "
                 "says whether each moves within its comparators"))
    return rows


def _quick_toolchain_reason(python: list[str]) -> str | None:
    """Why upstream's pypto toolchain does not import in ``python`` (one line), or None when it does."""
    import subprocess

    try:
        proc = subprocess.run([*python, "-c", "import pypto.language"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the worker Python {' '.join(python)} does not run ({exc})"
    if proc.returncode == 0:
        return None
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return f"upstream pypto toolchain not installed (import pypto.language failed: {last})"


def _compile_cache_row() -> tuple[str, str, str]:
    """$PTO_COMPILE_CACHE: off, a folder (its entries), an S3 prefix, or a value that cannot be used (ERROR)."""
    from backends.upstream.compile_cache import ENV, CompileCache, CompileCacheError

    try:
        cache = CompileCache.from_env()
    except CompileCacheError as exc:
        return ("ERROR", "compile cache", str(exc))
    if cache is None:
        return ("info", "compile cache", f"off: every device launch compiles its entry (${ENV}=DIR or "
                                         "s3://bucket/prefix keeps builds for later runs and other nodes)")
    if cache.folder is None:
        return ("info", "compile cache", f"{cache.spec} (S3; entries not listed here)")
    entries = list(cache.folder.rglob("*.tar")) if cache.folder.is_dir() else []
    return ("ok", "compile cache", f"{cache.folder}: {len(entries)} build(s), "
                                   f"{sum(e.stat().st_size for e in entries) / 2**20:.1f} MiB")


def cmd_doctor(args) -> int:
    rows = doctor_report(args.store, args.pypto_lib)
    table = Table(title="goldens doctor")
    for col in ("state", "piece", "detail"):
        table.add_column(col, overflow="fold")
    for state, piece, detail in rows:
        color = {"ok": "green", "MISSING": "red", "DAMAGED": "red", "ERROR": "red", "info": "cyan"}[state]
        table.add_row(f"[{color}]{state}[/]", piece, escape(detail))
    console.print(table)
    needed = {"python", "torch", "numpy", "zarr", "icechunk", "hypothesis", "crc32c", "golden store"}
    broken = [p for state, p, _d in rows if state == "MISSING" and p in needed]
    if broken:
        err.print(f"[bold red]error:[/] the default job cannot run: {', '.join(broken)} missing (see above)")
        return 2
    if any(state == "DAMAGED" for state, _p, _d in rows):
        err.print("[bold red]error:[/] the store is damaged (DAMAGED row above)")
        return 2
    if ("ERROR", "compile cache") in {(state, p) for state, p, _d in rows}:
        err.print("[bold red]error:[/] $PTO_COMPILE_CACHE cannot be used (compile cache row above)")
        return 2
    if any(state == "ERROR" for state, _p, _d in rows):
        err.print("[bold red]reference error:[/] the current reference raises on readable trees (ERROR row above)")
        return 3
    return 0


def cmd_gc(args) -> int:
    from goldens.store import GoldenStore

    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=args.older_than_days)
    doomed, dropped, summary = GoldenStore(args.store).gc(cutoff, keep_last=args.keep_last,
                                                          keep_regen_tags=args.keep_regen_tags, dry_run=args.dry_run)
    verb = "would expire" if args.dry_run else "expired"
    regen = "" if args.keep_regen_tags is None else f" but the regen tags past the newest {args.keep_regen_tags}"
    table = Table(title=f"gc: {verb} {len(doomed)} snapshot(s) older than {cutoff:%Y-%m-%d %H:%M} UTC (kept: tags{regen}, "
                        f"the head, the newest {args.keep_last})")
    for col in ("snapshot", "written (UTC)", "tags deleted", "message"):
        table.add_column(col, overflow="fold")
    for e in doomed:
        table.add_row(e.snapshot, f"{e.written_at:%Y-%m-%d %H:%M:%S}", " ".join(t for t in e.tags if t in dropped),
                      escape(e.message))
    console.print(table)
    console.print("dry run: nothing changed" if args.dry_run else f"gc: {summary}")
    return 0


def cmd_du(args) -> int:
    """What each tree (and each kept device run) costs: arrays, bytes as tensors, bytes stored for the contents
    only it names, and bytes of contents it shares with others (each content is stored once: goldens.store.POOL)."""
    import zarr
    from zarr.core.sync import sync

    from goldens.store import GoldenStore
    from goldens.store_format import POOL, pool_path

    store = GoldenStore(args.store)
    reader = store.reader(args.rev)
    owners: dict[str, set[str]] = {}
    units: dict[str, dict] = {}
    nodes = dict(reader.root.members(max_depth=None))  # every node with its attributes, in one listing
    for path in sorted(p for p, n in nodes.items() if isinstance(n, zarr.Array) and p.split("/")[0] != POOL):
        parts = path.split("/")
        unit = "/".join(parts[:4]) if parts[0] == "actual" else "/".join(parts[:2])
        node = nodes[path]
        attrs = dict(node.attrs)
        where = attrs.get("pool") or path  # an array stored the old way holds its own content
        u = units.setdefault(unit, {"arrays": 0, "tensor_bytes": 0, "contents": set()})
        u["arrays"] += 1
        u["tensor_bytes"] += int(node.nbytes)
        u["contents"].add(where)
        owners.setdefault(where, set()).add(unit)

    async def stored(paths: list[str]) -> list[int]:  # every content's stored bytes in one gather
        import asyncio

        async def one(w: str) -> int:
            node = nodes.get(w)
            if not isinstance(node, zarr.Array):
                raise GoldenStoreError(f"golden store {args.store}: {w}, named by a tree, is missing (goldens doctor)")
            return int(await node._async_array.nbytes_stored())

        return await asyncio.gather(*(one(w) for w in paths))

    names = sorted(owners)
    sizes = dict(zip(names, sync(stored(names)), strict=True))
    rows = []
    for unit, u in units.items():
        own = sum(sizes[w] for w in u["contents"] if len(owners[w]) == 1)
        shared = sum(sizes[w] for w in u["contents"] if len(owners[w]) > 1)
        rows.append({"tree": unit, "arrays": u["arrays"], "tensor_bytes": u["tensor_bytes"], "own_bytes": own,
                     "shared_bytes": shared})
    rows.sort(key=lambda r: (-r["own_bytes"], r["tree"]))
    pooled = sum(1 for w in owners if w.startswith(pool_path("")))
    total = {"trees": len(rows), "arrays": sum(r["arrays"] for r in rows), "contents": len(owners),
             "pooled_contents": pooled, "tensor_bytes": sum(r["tensor_bytes"] for r in rows),
             "stored_bytes": sum(sizes.values())}
    if not store.location.remote:
        files = [p for p in (store.root / "icechunk").rglob("*") if p.is_file()]
        total["files"] = len(files)
        total["file_bytes"] = sum(p.stat().st_size for p in files)
        total["disk_bytes"] = sum(p.stat().st_blocks * 512 for p in files)
    if args.json:
        _emit({"store": str(args.store), "snapshot": reader.snapshot, "trees": rows[:args.top] if args.top else rows,
               "total": total})
        return 0
    mib = lambda n: f"{n / 2**20:.2f}"  # noqa: E731
    table = Table(title=escape(f"du of {args.store}@{reader.snapshot[:12]} (MiB; own: contents only this tree "
                               "names, shared: contents other trees name too, stored once)"))
    for col in ("tree", "arrays", "as tensors", "own", "shared"):
        table.add_column(col, overflow="fold", justify="left" if col == "tree" else "right")
    for r in rows[:args.top] if args.top else rows:
        table.add_row(r["tree"], str(r["arrays"]), mib(r["tensor_bytes"]), mib(r["own_bytes"]), mib(r["shared_bytes"]))
    console.print(table)
    line = (f"{total['trees']} tree(s), {total['arrays']} array(s), {total['contents']} distinct content(s): "
            f"{mib(total['tensor_bytes'])} MiB as tensors, {mib(total['stored_bytes'])} MiB stored")
    if "files" in total:
        line += (f"; the repository is {total['files']} file(s), {mib(total['file_bytes'])} MiB, "
                 f"{mib(total['disk_bytes'])} MiB on disk")
    if total["contents"] > total["pooled_contents"]:
        line += f"; {total['contents'] - total['pooled_contents']} array(s) stored the old way (goldens gc stores them once)"
    console.print(line)
    return 0


def cmd_export(args) -> int:
    from goldens import trees
    from goldens.store import GoldenStore

    reader = GoldenStore(args.store).reader(args.rev)
    written = []
    for case, wiring in tree_items([args.case], args.wiring, reader=reader):
        written += trees.export_pt(reader, case, wiring, Path(args.dir))
    console.print(f"wrote {len(written)} .pt files under {args.dir}")
    return 0


def cmd_import(args) -> int:
    from goldens import trees
    from goldens.cases import get_case
    from goldens.store import GoldenStore

    case = get_case(args.case)
    directory = Path(args.dir)
    wirings = [w for w in select_wirings(args.wiring) if w in case.wirings and (directory / w).is_dir()]
    if not wirings:
        raise GoldenStoreError(f"{directory}: no per-wiring directory for case {args.case} "
                               f"(expected {' or '.join(case.wirings)} under it)")
    warnings: list[str] = []
    result = trees.import_pt(GoldenStore(args.store), args.case, directory, tuple(wirings), warnings)
    console.print(f"imported {args.case} ({', '.join(wirings)}); snapshot {result.snapshot or '(unchanged)'}")
    for line in warnings:
        err.print(f"[yellow]warning:[/] {escape(line)}", highlight=False, soft_wrap=True)
    return 0


def cmd_import_kept(args) -> int:
    from goldens.recorded import import_kept, sources
    from goldens.store import GoldenStore

    if len(args.cases_module) != 1:
        raise GoldenStoreError("import-kept: name the one module that builds these cases with --cases-module "
                               "(e.g. goldens.cases.pro): the recipe stored with the outputs")
    from_reader = GoldenStore(args.source_store).reader()
    have = sources(from_reader)
    source = args.source or (have[0] if len(have) == 1 else None)
    if source is None or source not in have:
        raise GoldenStoreError(f"import-kept: --source must name one of the kept sources in {args.source_store}: "
                               f"{have or 'none kept'}")
    items = [(c, w) for c in args.cases for w in select_wirings(args.wiring)]
    result = import_kept(GoldenStore(args.store), from_reader, source, items, args.cases_module[0])
    console.print(f"imported the {source} outputs of {len(items)} run(s); snapshot {result.snapshot or '(unchanged)'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="goldens", description="Versioned replay trees (inputs + expected outputs, "
                                "one per wiring) for the V4.1 kernels, stored as Zarr in an icechunk repository. "
                                "Exit codes: 0 pass, 1 contract failure, 2 usage or store error, 3 backend error.",
                                epilog="A team shares one store on S3: --store s3://BUCKET/PREFIX, with credentials, "
                                "region and endpoint from the usual AWS environment (AWS_ACCESS_KEY_ID, "
                                "AWS_SECRET_ACCESS_KEY or AWS_PROFILE, AWS_REGION, AWS_ENDPOINT_URL for an "
                                "S3-compatible server). Writers never lose each other's commits: a local store "
                                "serializes them with a lock file, S3 commits are optimistic and rerun on a moved "
                                "branch.")
    p.add_argument("--cases-module", action="append", default=[], metavar="MODULE",
                   help="import a module that registers user cases (goldens.cases.register); repeatable; also "
                        "PTO_GOLDEN_CASES")
    p.add_argument("--store", default=DEFAULT_STORE, metavar="PATH|s3://BUCKET/PREFIX",
                   help=f"store root: a directory or an S3 prefix (default {DEFAULT_STORE}; env PTO_GOLDEN_STORE)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_store_commands(sub)
    _add_inspect_commands(sub)
    _add_transfer_commands(sub)
    return p


def _wiring(sp, default="both"):
    sp.add_argument("--wiring", default=default, choices=("both", "replicated", "sharded"),
                    help=f"which wiring's trees (default {default}; both = replicated then sharded)")


def _replay_arguments(sp):
    sp.add_argument("cases", nargs="*", metavar="CASE")
    sp.add_argument("--backend", default="torch",
                    help="built-in backend (torch, emulated, upstream, pypto), or recorded[:SOURCE]: the "
                         "outputs a device run kept with --keep-actual (e.g. recorded:pypto-a5sim), judged again")
    sp.add_argument("--backend-module", default=None, metavar="MOD:OBJ", help="out-of-tree backend")
    sp.add_argument("--platform", default=None, choices=("a5sim", "a5"),
                    help="platform of a device backend (pypto; default a5sim); refused for CPU backends")
    sp.add_argument("--device", default=None, metavar="IDS",
                    help="device ids for a device backend, e.g. 0,1 (one launch, compile included, is stopped "
                         "after $PTO_DEVICE_TIMEOUT seconds, default 1800: an ERROR row naming the entry)")
    _model(sp)
    sp.add_argument("--pypto-lib", default=None, metavar="PATH",
                    help="pypto-lib checkout the pypto backend binds (default $PYPTO_LIB_ROOT)")
    sp.add_argument("--allow-unavailable", action="store_true",
                    help="exit 0 although the backend is unavailable or every tree was skipped (default: exit 3)")
    sp.add_argument("-v", "--verbose", action="store_true", help="tracebacks in ERROR rows")
    sp.add_argument("-q", "--quiet", action="store_true", help="print only rows that did not pass")
    sp.add_argument("--json", action="store_true", help="one JSON document on stdout instead of the table")
    sp.add_argument("--junit", default=None, metavar="FILE", help="also write JUnit XML (one testcase per output)")
    sp.add_argument("--keep-actual", action="store_true",
                    help="commit the backend's actual outputs beside the trees, under actual/<backend>-<platform>/ "
                         "(diff them with goldens diff)")
    sp.add_argument("--rev", default=None, help="snapshot id or tag to replay (default: main)")
    sp.add_argument("--allow-stale", action="store_true", help="replay stale trees anyway (prints a loud warning)")
    sp.add_argument("--devices", default=None, metavar="IDS",
                    help="replay on several devices at once: one worker process per id (0-15, 0,2,4-7), each "
                         "with the backend pinned to its device through --device, trees shared out by case, "
                         "largest first; one table with a device column, then a per-device summary")
    sp.add_argument("--cluster", default=None, metavar="ray[://HOST:PORT]",
                    help="replay on a Ray cluster (pip install -e '.[cluster]'): the cases shared out by bytes "
                         "into four tasks per slot, each asking for one NPU on --platform a5, else --task-cpus CPU "
                         "slots; a task whose node dies runs "
                         "again elsewhere, one that runs past $PTO_DEVICE_TIMEOUT per tree is an ERROR naming its "
                         "node; one table with a node column, per-node and per-task summaries. `ray`: "
                         "$RAY_ADDRESS, else the cluster `ray start` left here, else a new one here; "
                         "ray://HOST:PORT: the Ray client. The store must be one every node reaches (s3:// or a "
                         "shared path); kept outputs go in once per tree")
    sp.add_argument("--task-cpus", type=_positive_float, default=1.0, metavar="N",
                    help="CPU slots one --cluster task asks Ray for (default 1; a5sim compiles with g++)")
    sp.add_argument("--run-id", default=None, help=argparse.SUPPRESS)  # a distributed replay's tasks: keep once
    sp.add_argument("--operator", action="append", default=[], metavar="NAME",
                    help="only the trees that reach operator NAME: its own trees, and those of compositions "
                         "whose reference goes through it; repeatable or comma-separated")
    _wiring(sp)


def _model(sp) -> None:
    from kernels.record import MODELS

    sp.add_argument("--model", default=None, metavar="FOLDER",
                    choices=MODELS,
                    help="the upstream model folder whose goldens (--backend upstream, record --from upstream) or "
                         "entries (--backend pypto) are used (default deepseek_v4_pro; deepseek_v4_pro:flash: that "
                         "folder built with its flash preset, DEEPSEEK_V4_VARIANT=flash)")


def _json(sp) -> None:
    sp.add_argument("--json", action="store_true", help="one JSON document on stdout instead of the table(s)")


def _rev_and_json(sp) -> None:
    sp.add_argument("--rev", default=None, help="snapshot id or tag (default: main)")
    _json(sp)


def _add_store_commands(sub) -> None:
    """record, replay, report, regen: the commands that write trees or judge them."""
    r = sub.add_parser("record", help="generate inputs, compute reference outputs, commit",
                       description="Generate each case's inputs from --seed, compute the reference outputs and "
                                   "commit the trees in one snapshot. No CASE: every known case.")
    r.add_argument("cases", nargs="*", metavar="CASE")
    _wiring(r)
    r.add_argument("--seed", type=_seed, default=17, help="input seed, in [0, 2^62) (default 17)")
    r.add_argument("--force", action="store_true",
                   help="replace a recorded tree whose content would change (refused by default, saying what "
                        "would change); recording identical content is always a no-op")
    r.add_argument("--from", dest="source", choices=("reference", "upstream"), default="reference",
                   help="where the expected outputs come from: this project's Torch reference (default), or "
                        "upstream pypto-lib's own Torch goldens through the upstream backend (trees named "
                        "up-<case>, recording the upstream commit, golden functions and named variants; replayed "
                        "on any backend, never regenerated from the reference)")
    _model(r)
    r.add_argument("--pypto-lib", default=None, metavar="PATH",
                   help="with --from upstream: the pypto-lib checkout (default $PYPTO_LIB_ROOT)")
    r.add_argument("--geometry", choices=("flash", "pro", "v4-flash"), default=None,
                   help="record the cases at a model's own geometry, as a device compiled for it takes them "
                        "(flash: every attention half-layer at V4.1-Flash's dims, 400-500 MB a tree; pro: the V4-Pro "
                        "operator cases; v4-flash: the operator records' cases at main's V4-Flash dims, and the MoE "
                        "stage at the 64 experts Flash-MTP's moe.py keeps at EP 2, 1.6 GB); no CASE: "
                        "all of them. Never into the sample store: name a --store (a "
                        "directory or s3://BUCKET/PREFIX). Replay, report and show find these cases by themselves")
    r.set_defaults(fn=cmd_record)

    rp = sub.add_parser("replay", help="run a backend on stored inputs and judge its outputs",
                        description="Run the backend on each stored tree's inputs and judge every output with the "
                                    "tree's comparator. Stale trees (reference changed since recording) are refused.")
    _replay_arguments(rp)
    rp.add_argument("--report", default=None, metavar="DIR",
                    help="also write the HTML report of this replay to DIR/index.html (see goldens report)")
    rp.set_defaults(fn=cmd_replay)

    rr = sub.add_parser("report", help="replay and write a self-contained HTML page of the verdicts",
                        description="Replay exactly as `goldens replay` does (same options, same exit codes) and "
                                    "write DIR/index.html: per tree and output the verdict, the comparator and its "
                                    "bound, the failure message with its evidence and cause, every row's error "
                                    "against its bound (failing rows in red), a histogram of the element errors in "
                                    "ULPs of the output's dtype (format steps for FP4, codes for E8M0) and the "
                                    "snapshots that changed the expected value. Plots are inlined: the page is one "
                                    "file and needs no network.")
    _replay_arguments(rr)
    rr.add_argument("--out", default="goldens-report", metavar="DIR",
                    help="directory for index.html (default ./goldens-report; created if missing)")
    rr.set_defaults(fn=cmd_report, report=None)

    rg = sub.add_parser("regen", help="recompute expected outputs with the current reference",
                        description="Recompute expected outputs from stored inputs with the current reference; "
                                    "commit only changed arrays in one tagged snapshot and report what moved. Each "
                                    "tree's change is classified: 'rounding' (every moved output still within the "
                                    "tree's own comparator of the stored one, or one unit of its dtype) is written; "
                                    "past its comparator (a rule change, or a reference bug: they look the same) is "
                                    "refused with exit 1 and nothing committed, unless --accept-moved -m REASON.")
    rg.add_argument("cases", nargs="*", metavar="CASE")
    rg.add_argument("--dry-run", action="store_true", help="report the changes without committing")
    rg.add_argument("-m", "--message", default=None, metavar="REASON",
                    help="why the reference changed (kept in the regen snapshot's message, shown by goldens log)")
    _json(rg)
    rg.add_argument("--accept-moved", "--accept-rule-change", dest="accept_rule_change", action="store_true",
                    help="also write trees whose outputs move past their own comparators of the stored ones (refused "
                         "by default, exit 1, nothing committed: a rounding change stays within them or moves one "
                         "unit, a rule change or a reference bug does not); needs -m REASON, kept in the snapshot, "
                         "and prints each tree it accepted")
    _wiring(rg)
    rg.set_defaults(fn=cmd_regen)


def _add_inspect_commands(sub) -> None:
    """log, diff, show, doctor, gc, du: the commands that look at a store (gc also expires)."""
    lg = sub.add_parser("log", help="snapshots of the store, newest first")
    lg.add_argument("--limit", type=_positive_int, default=50, help="newest N snapshots (default 50)")
    lg.set_defaults(fn=cmd_log)

    df = sub.add_parser("diff", help="arrays added/changed/removed between two revisions",
                        description="Compare two revisions (snapshot ids, tags or main) array by array.")
    df.add_argument("rev_a", metavar="REV_A")
    df.add_argument("rev_b", metavar="REV_B")
    _json(df)
    df.set_defaults(fn=cmd_diff)

    sh = sub.add_parser("show", help="a case's trees: record, arguments, comparators, staleness")
    sh.add_argument("case", nargs="?", metavar="CASE", help="omit to list every case")
    _rev_and_json(sh)
    sh.set_defaults(fn=cmd_show)

    dr = sub.add_parser("doctor", help="what is present and missing: packages, upstream toolchain, the store",
                        description="One line per piece: the Python packages, the pypto-lib checkout and toolchain "
                                    "(pypto.language, golden.runner, A5 platforms), the bound operators, and the "
                                    "store (head, trees, staleness); each missing piece says what to do. Exit 2 "
                                    "when the default job (Torch reference + local store) cannot run.")
    dr.add_argument("--pypto-lib", default=None, metavar="PATH", help="pypto-lib checkout (default $PYPTO_LIB_ROOT)")
    dr.set_defaults(fn=cmd_doctor)

    gc = sub.add_parser("gc", help="expire old snapshots (tags kept) and delete unreachable data")
    gc.add_argument("--older-than-days", type=_days, default=30.0,
                    help="expire untagged snapshots older than this many days (a finite number >= 0; default 30)")
    gc.add_argument("--keep-last", type=_count, default=10, metavar="N",
                    help="never expire the newest N snapshots of the branch (default 10; 0 keeps only the head)")
    gc.add_argument("--keep-regen-tags", type=_count, default=None, metavar="N",
                    help="keep only the newest N of the regen-<time> tags that regen makes: an older one is deleted "
                         "with its snapshot when that snapshot is otherwise expired (other tags are never deleted; "
                         "default: keep every tag). For a store kept small, e.g. the sample store in git")
    gc.add_argument("--dry-run", action="store_true", help="list what would be expired; change nothing")
    gc.set_defaults(fn=cmd_gc)

    du = sub.add_parser("du", help="what each tree costs in the store",
                        description="Per tree (and per kept device run): its arrays, their bytes as tensors, the "
                                    "bytes stored for contents only it names, and for contents it shares with "
                                    "other trees (each distinct content is stored once); then the store's totals, "
                                    "and for a local store its files and their size on disk. Largest first.")
    _rev_and_json(du)
    du.add_argument("--top", type=_count, default=0, metavar="N", help="only the N largest (default: all)")
    du.set_defaults(fn=cmd_du)


def _add_transfer_commands(sub) -> None:
    """import-pt, import-kept, export-pt: trees and kept runs in and out of a store."""
    ip = sub.add_parser("import-pt", help="import an upstream <dir>/<wiring>/{in,out}/<name>.pt tree",
                        description="Import upstream replay files (read with torch.load(weights_only=True); a "
                                    "pickled object is refused). Names, directions and dtypes must match the case.")
    ip.add_argument("dir", metavar="DIR")
    ip.add_argument("--case", required=True)
    _wiring(ip)
    ip.set_defaults(fn=cmd_import)

    ik = sub.add_parser("import-kept", help="copy a device's kept outputs (not their trees) from another store",
                        description="Copy the outputs a device run kept (goldens replay --keep-actual) for CASEs "
                                    "from the store FROM, where their trees are, into --store, without the trees' "
                                    "inputs: with the case module (--cases-module, required) and seed that rebuild "
                                    "them. `goldens replay --backend recorded:SOURCE` then rebuilds the inputs, "
                                    "judges the kept outputs only if their digest is the one the device ran on, and "
                                    "computes the expected outputs with the current reference. For trees at a "
                                    "kernel's own geometry, too large for the sample store. Refused, nothing "
                                    "written, for a stale tree, a run kept for other inputs, or a builder that does "
                                    "not give them again.")
    ik.add_argument("cases", nargs="+", metavar="CASE")
    ik.add_argument("--from", dest="source_store", required=True, metavar="PATH|s3://BUCKET/PREFIX",
                    help="the store the device run was kept in")
    ik.add_argument("--source", default=None, metavar="SOURCE",
                    help="the kept run's source, <backend>-<platform> (default: the only one kept there)")
    _wiring(ik, "replicated")
    ik.set_defaults(fn=cmd_import_kept)

    ep = sub.add_parser("export-pt", help="export a case to the upstream .pt layout")
    ep.add_argument("case", metavar="CASE")
    ep.add_argument("dir", metavar="DIR")
    ep.add_argument("--rev", default=None)
    _wiring(ep)
    ep.set_defaults(fn=cmd_export)


def _float_arg(low: float, *, inclusive: bool, expected: str):
    """An argparse type: a finite float above ``low`` (or equal to it when ``inclusive``), else the usage error
    "<expected>, got <text>"."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < low or (value == low and not inclusive):
            raise argparse.ArgumentTypeError(f"{expected}, got {text!r}")
        return value
    return parse


_positive_float = _float_arg(0.0, inclusive=False, expected="expected a finite number > 0")
_days = _float_arg(0.0, inclusive=True, expected="expected a finite number of days >= 0")


_count = _int_arg(0, expected="expected a whole number >= 0")


# output options of the subcommands: (argparse dest, how the error names it)
OUTPUTS = (("junit", "--junit"), ("report", "--report"), ("out", "--out"), ("dir", "export-pt DIR"))


def _refuse_outputs_in_stores(args) -> None:
    """Before a command runs: no file or folder it would write lies inside a golden store, and a local store is
    not inside another store (issue #48 item 2). One line, exit 2, nothing written."""
    from goldens.outside import refuse_inside_store, refuse_store_inside_store

    for dest, what in OUTPUTS:
        value = getattr(args, dest, None)
        if isinstance(value, str) and value:
            refuse_inside_store(value, what)
    store = getattr(args, "store", None)
    if isinstance(store, str) and "://" not in store:
        refuse_store_inside_store(store)


def main(argv: list[str] | None = None) -> int:
    from backends.lifetime import TASK, die_with_parent

    die_with_parent(TASK)  # a distributed replay's task: never outlive the worker that started it
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.cases_module:
            from goldens.cases import load_case_modules

            load_case_modules(args.cases_module)
        _refuse_outputs_in_stores(args)
        return args.fn(args)
    except RuleChange as exc:  # regen: outputs past their comparators, nothing committed (out of bound: 1)
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 1
    except GoldenStoreError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)  # one unwrapped line
        return 2
    except icechunk.IcechunkError as exc:  # a snapshot, manifest or ref the repository cannot read
        err.print(f"[bold red]error:[/] {escape(damaged(args.store, exc))}", highlight=False, soft_wrap=True)
        return 2
    except BackendFailure as exc:
        err.print(f"[bold red]backend error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 3
    except KeyboardInterrupt:
        err.print("[bold red]interrupted[/] (Ctrl-C); nothing was committed", highlight=False)
        return 130
    except OSError as exc:  # the file system under the store: missing, read-only, full, a file where a dir is
        where = exc.filename or args.store
        err.print(f"[bold red]error:[/] {escape(str(where))}: {escape(exc.strerror or str(exc))} (store "
                  f"{escape(str(args.store))}; nothing was committed)", highlight=False, soft_wrap=True)
        return 2
    except Exception as exc:  # a bug of goldens (or of what it runs on): one line, never a traceback (exit 3)
        if os.environ.get("PTO_DEBUG"):
            raise
        err.print(f"[bold red]internal error:[/] {escape(internal_error(exc))}", highlight=False, soft_wrap=True)
        return 3


def internal_error(exc: BaseException) -> str:
    """One line for an exception nothing expected: its type, its first line, and the innermost frame of this
    project's code it passed through (else the innermost of all)."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    root = str(Path(__file__).resolve().parents[1])
    ours = [f for f in frames if f.filename.startswith(root) and "/.venv/" not in f.filename]
    at = (ours or frames)[-1:]
    where = f" (at {Path(at[0].filename).resolve().relative_to(root) if ours else at[0].filename}:{at[0].lineno})" \
        if at else ""
    text = (str(exc).strip().splitlines() or [""])[0][:300]
    return (f"{type(exc).__name__}: {text}{where}; the store holds only completed commits (goldens log lists "
            "them); PTO_DEBUG=1 shows the traceback")


if __name__ == "__main__":
    sys.exit(main())
