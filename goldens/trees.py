"""Replay trees: record, load (with spec, wiring and staleness checks), replay on a backend, regenerate,
diff, and the upstream ``.pt`` layout. Builds on the store (bytes), the codec (tensors) and the catalog.

Spec: §7.2 (one tree per wiring, never fed to the other), §7.3 (in/out layout, ScalarSpec, directions).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.metadata
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

import torch

from contracts.compare import TOLERANCES, Context, compare_all
from contracts.operators import MissingOperator, Unsupported, operators_reached
from contracts.result import CheckResult
from goldens.cases import (
    Case,
    WithVariants,
    cases,
    derived,
    fingerprint_parts,
    get_case,
    register,
    rounding_versions,
    upstream_case,
)
from goldens.catalog import ACTUAL_ROOT, WIRINGS, ArgSpec, TreeRecord, tree_path
from goldens.codec import from_numpy, to_numpy
from goldens.errors import BackendFailure, GoldenStoreError, RuleChange
from goldens.fingerprint import changes, combined
from goldens.store import GoldenStore
from goldens.store_format import REGEN_TAG_PREFIX, digest
from goldens.store_read import StoreReader
from goldens.store_write import CommitResult
from kernels.tables import watch_reads


def _versions() -> dict:
    try:
        pkg = importlib.metadata.version("pto-contracts")
    except importlib.metadata.PackageNotFoundError:
        pkg = "unknown"
    return {"pto-contracts": pkg, "torch": torch.__version__}


def _clone(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in d.items()}


def tree_arrays(case: Case, record: TreeRecord, inputs: dict, outputs: dict) -> dict:
    arrays = {}
    base = tree_path(case.name, record.wiring)
    for spec in record.args:
        if spec.is_input:
            arrays[f"{base}/in/{spec.name}"] = to_numpy(inputs[spec.name])
        if spec.is_output:
            arrays[f"{base}/out/{spec.name}"] = to_numpy(outputs[spec.name])
    return arrays


def make_record(case: Case, wiring: str, seed: int, inputs: dict, outputs: dict, source: str = "record",
                read: set[str] | None = None) -> TreeRecord:
    """The tree's record; ``read``: the rule-table entries the reference looked up computing ``outputs``
    (``kernels.tables.watch_reads``), the only ones the tree goes stale on (None: every entry)."""
    specs = case.arg_specs(inputs, outputs)
    arrays = {}
    for spec in specs:
        if spec.is_input:
            arrays[f"in/{spec.name}"] = digest(to_numpy(inputs[spec.name])[0])
        if spec.is_output:
            arrays[f"out/{spec.name}"] = digest(to_numpy(outputs[spec.name])[0])
    return TreeRecord(case=case.name, operator=case.operator, preset=case.preset, wiring=wiring, seed=seed,
                      args=specs, comparators=case.comparators(wiring),
                      params=dict(case.params), versions=_versions(), fingerprint=combined(parts := fingerprint_parts(case, read)),
                      fingerprint_parts=parts, base_case=case.base or "",
                      rounding=rounding_versions(case), source=source, upstream=dict(case.upstream),
                      tolerances={out: TOLERANCES.get(comp, {}) for out, comp in case.comparators(wiring).items()},
                      arrays=arrays)


def _reference_run(case: Case, inputs: dict, wiring: str) -> tuple[dict, set[str]]:
    """The reference on a copy of ``inputs`` -> (outputs, the rule-table entries it looked up)."""
    with watch_reads() as read:
        outputs = case.reference(_clone(inputs), wiring)
    judged = case.comparators(wiring)  # a record's output not judged at the case's geometry (outputs_at: None)
    return {k: v for k, v in outputs.items() if k in judged}, read


def build_tree(case: Case, wiring: str, seed: int, source: str = "record") -> tuple[TreeRecord, dict, dict]:
    if wiring not in case.wirings:
        raise GoldenStoreError(f"case {case.name} has no {wiring} wiring (it has {list(case.wirings)})")
    inputs = case.build_inputs(seed, wiring)
    outputs, read = _reference_run(case, inputs, wiring)
    return make_record(case, wiring, seed, inputs, outputs, source=source, read=read), inputs, outputs


def record(store: GoldenStore, items: list[tuple[str, str]], seed: int, *, force: bool = True) -> CommitResult:
    """Record (case, wiring) trees in one commit. With ``force=False`` (the CLI's default) a tree already
    stored with other content is not overwritten: GoldenStoreError says which arrays would change (checked
    against the head the commit goes on, so a concurrent record cannot slip in between)."""
    arrays, groups = {}, {}
    for name, wiring in items:
        case = get_case(name)
        rec, inputs, outputs = build_tree(case, wiring, seed)
        arrays.update(tree_arrays(case, rec, inputs, outputs))
        groups[tree_path(case.name, wiring)] = rec.to_attrs()

    label = ", ".join(f"{c}/{w}" for c, w in items)
    return _commit_trees(store, arrays, groups, force=force, message=f"record {label} (seed {seed})",
                         metadata={"action": "record", "seed": seed})


def _commit_trees(store: GoldenStore, arrays: dict, groups: dict, *, force: bool, message: str,
                  metadata: dict) -> CommitResult:
    """Write recorded trees in one commit; without ``force`` a tree stored with other content is refused, saying
    what would change (checked against the head the commit goes on, under the store's lock)."""
    def body(txn):
        if not force:
            changes = [line for path, attrs in groups.items() if (line := _overwrite(txn.reader, path, attrs))]
            if changes:
                raise GoldenStoreError("refusing to overwrite recorded tree(s): " + "; ".join(changes)
                                       + " (pass --force to replace them; nothing was committed)")
        txn.write(arrays, groups)

    _none, result = store.update(body, message, metadata=metadata)
    return result


def record_from_upstream(store: GoldenStore, backend, items: list[tuple[str, str]], seed: int, *,
                         force: bool = False) -> tuple[list[str], CommitResult]:
    """Record, for each (case, wiring), a tree named ``up-<case>`` whose inputs come from ``seed`` and whose
    expected outputs are upstream's own goldens run through ``backend`` (the upstream backend), called with the
    named variants upstream's goldens follow; the tree record names the repository, the commit, the golden
    functions and those variants. One commit; an existing tree with other content is refused unless ``force``."""
    provenance = getattr(backend, "provenance", None) or {}
    if not provenance.get("commit"):
        raise GoldenStoreError(f"backend {getattr(backend, 'name', backend)!r} names no upstream commit: record "
                               "--from upstream needs the upstream backend on a git checkout of pypto-lib")
    arrays, groups, names = {}, {}, []
    for name, wiring in items:
        base = get_case(name)
        if base.upstream or base.base:
            raise GoldenStoreError(f"case {name} is itself derived (from {base.base}); record its base case")
        ops = base.operator.split("+")
        missing = [op for op in ops if not backend.has(op)]
        if missing:
            why = "; ".join(f"{op}: {backend.why_missing.get(op, 'not bound')}" for op in missing)
            raise GoldenStoreError(f"case {name} needs {missing} from backend {backend.name!r}: {why}")
        if wiring not in base.wirings:
            raise GoldenStoreError(f"case {name} has no {wiring} wiring (it has {list(base.wirings)})")
        inputs = base.build_inputs(seed, wiring)
        variants = {op: dict(backend.variants[op]) for op in ops if backend.variants.get(op)}
        called = provenance.get("called")  # the golden functions this case's call reached, when the backend says
        if isinstance(called, list):
            called.clear()
        try:
            outputs = base.run(WithVariants(backend, variants), _clone(inputs), wiring)
        except MissingOperator:
            raise
        except Exception as exc:
            first = str(exc).splitlines()[0][:300] if str(exc) else ""
            raise BackendFailure(f"{name}/{wiring}: upstream raised in {base.operator}: {type(exc).__name__}: "
                                 f"{first}") from exc
        upstream = {"repository": provenance.get("repository", ""), "commit": provenance["commit"],
                    "dirty": bool(provenance.get("dirty")),
                    "goldens": sorted(set(called) if isinstance(called, list) and called else
                                      {provenance.get("goldens", {}).get(op, "") for op in ops} - {""}),
                    "variants": variants, **({"folder": provenance["folder"]} if provenance.get("folder") else {}),
                    **({"model": provenance["model"]} if provenance.get("model") else {})}
        case = register(upstream_case(base, inputs, upstream), replace=True)
        rec = make_record(case, wiring, seed, inputs, outputs, source=f"upstream {provenance['commit'][:12]}")
        arrays.update(tree_arrays(case, rec, inputs, outputs))
        groups[tree_path(case.name, wiring)] = rec.to_attrs()
        names.append(case.name)

    label = ", ".join(f"{c}/{w}" for c, w in items)
    return names, _commit_trees(store, arrays, groups, force=force,
                                message=f"record from upstream {provenance['commit'][:12]}: {label} (seed {seed})",
                                metadata={"action": "record-upstream", "seed": seed,
                                          "upstream_commit": provenance["commit"]})


def _record_changes(old: dict, new: dict) -> str:
    """What changed between two tree records, in words (arrays are diffed on their own)."""
    out = []
    if old.get("fingerprint") != new.get("fingerprint"):
        moved = changes(old.get("fingerprint_parts", {}), new.get("fingerprint_parts", {}))
        out.append("fingerprint: " + ("; ".join(moved[:5]) + (f"; +{len(moved) - 5} more" if len(moved) > 5 else "")
                                      if moved else f"{old.get('fingerprint')} -> {new.get('fingerprint')}"))
    for key in ("tolerances", "comparators", "seed", "versions", "source", "params", "preset"):
        if old.get(key) != new.get(key):
            if isinstance(old.get(key), dict) and isinstance(new.get(key), dict):
                keys = sorted(k for k in set(old[key]) | set(new[key]) if old[key].get(k) != new[key].get(k))
                out += [f"{key}.{k}: {old[key].get(k)!r} -> {new[key].get(k)!r}" for k in keys]
            else:
                out.append(f"{key}: {old.get(key)!r} -> {new.get(key)!r}")
    return "; ".join(out)


def _same_content(old: dict, new: dict) -> bool:
    """Two tree records describe the same tree: every array's digest and the reference fingerprint agree."""
    return old.get("arrays") == new.get("arrays") and old.get("fingerprint") == new.get("fingerprint")


def _overwrite(reader: StoreReader, path: str, new: dict) -> str:
    """'' when the tree at ``path`` is absent or identical to ``new``, else what would change."""
    if not reader.has(path):
        return ""
    old = reader.group_attrs(path)
    before, after = old.get("arrays", {}), new.get("arrays", {})
    moved = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    seed = f"seed {old.get('seed')} -> {new.get('seed')}" if old.get("seed") != new.get("seed") else ""
    if not seed and _same_content(old, new):
        return ""
    what = ", ".join(moved[:6]) + (f" (+{len(moved) - 6} more)" if len(moved) > 6 else "")
    return f"{path}: {what or 'record attributes'} would change" + (f" ({seed})" if seed else "")


def record_counterexample(store: GoldenStore, base_name: str, inputs: dict, *, label: str,
                          wiring: str = "replicated") -> tuple[str, CommitResult]:
    """Record ``inputs`` (a failing example) as a tree of a case derived from ``base_name`` -- its operator,
    call, reference and comparators -- named ``cx-<base>-<digest of the inputs>``; replayed forever after."""
    base = get_case(base_name)
    h = hashlib.sha256()
    for k in sorted(inputs):
        h.update(k.encode() + digest(to_numpy(inputs[k])[0]).encode())
    name = f"cx-{base_name}-{h.hexdigest()[:10]}"
    case = register(derived(base, name, inputs, description=f"counterexample of {base_name} from {label}"),
                    replace=True)
    rec, ins, outs = build_tree(case, wiring, -1, source=f"counterexample {label}")
    result = store.commit(tree_arrays(case, rec, ins, outs), {tree_path(name, wiring): rec.to_attrs()},
                          f"record counterexample {name} ({label})", metadata={"action": "counterexample"})
    return name, result


def recorded_wirings(reader: StoreReader, case: str) -> list[str]:
    return [w for w in WIRINGS if reader.has(f"{case}/{w}")]


def recorded_cases(reader: StoreReader) -> list[str]:
    """Cases with a recorded tree; a recorded counterexample's derived case is registered on the way."""
    out = [c for c in reader.groups() if recorded_wirings(reader, c)]
    for name in out:
        adopt(reader, name)
    return out


def tree_operators(reader: StoreReader, case: str, wiring: str) -> frozenset[str]:
    """The operators a recorded tree reaches (contracts.operators.operators_reached of its record)."""
    attrs = reader.group_attrs(tree_path(case, wiring))
    return operators_reached(attrs.get("operator", ""), attrs.get("fingerprint_parts", {}))


def adopt(reader: StoreReader, name: str) -> None:
    """Register the derived case of a counterexample tree or of a tree recorded from upstream (its record names
    its base case, and upstream's provenance), if needed."""
    known = cases().get(name)
    if known is not None and not known.upstream:
        return
    for wiring in recorded_wirings(reader, name):
        attrs = reader.group_attrs(tree_path(name, wiring))
        base = attrs.get("base_case")
        if base and attrs.get("upstream"):
            if known is None or known.upstream != attrs["upstream"]:  # this store's provenance is the truth
                register(upstream_case(get_case(base), None, attrs["upstream"]), replace=True)
            return
        if base:
            register(derived(get_case(base), name))
            return


@dataclass
class LoadedTree:
    case: Case
    record: TreeRecord
    inputs: dict[str, torch.Tensor]
    expected: dict[str, torch.Tensor]
    stale: bool
    moved: tuple[str, ...] = ()  # what changed in the reference since recording ("changed kernels.quant.RULES")

    def moved_text(self) -> str:
        return "; ".join(self.moved[:4]) + (f"; +{len(self.moved) - 4} more" if len(self.moved) > 4 else "")

    def stale_reason(self) -> str:
        return f"{self.moved_text()}: run `goldens regen {self.case.name}`"


def load_tree(reader: StoreReader, case_name: str, wiring: str) -> LoadedTree:
    """Read one tree and check it: the tree is for this wiring and case, its argument spec (names, order,
    directions, dtypes) matches the operator's, every array is present with its recorded shape/dtype."""
    path = tree_path(case_name, wiring)
    adopt(reader, case_name)  # a recorded counterexample: rebuilt from its base case
    case = get_case(case_name)
    if not reader.has(path):
        have = recorded_wirings(reader, case_name)
        raise GoldenStoreError(f"no {wiring} tree for case {case_name} (recorded wirings: {have or 'none'}); "
                               "a tree saved by one wiring is never fed to the other")
    rec = TreeRecord.from_attrs(reader.group_attrs(path), where=path)
    from contracts.compare import COMPARATORS

    unknown = sorted({c for c in rec.comparators.values() if c not in COMPARATORS})
    if unknown:
        raise GoldenStoreError(f"{path}: the tree names comparator(s) {unknown} that this version does not have "
                               f"(known: {sorted(COMPARATORS)}); record the tree again or use the version that "
                               "wrote it")
    if rec.wiring != wiring or rec.case != case_name:
        raise GoldenStoreError(f"{path}: tree records case {rec.case!r} wiring {rec.wiring!r}; refusing to replay "
                               f"it as {case_name}/{wiring}")
    try:
        probe = _spec_probe(case, wiring)
    except (GoldenStoreError, MissingOperator, Unsupported):
        raise
    except Exception as exc:  # the reference itself fails: a reference error (exit 3), named, never a traceback
        raise BackendFailure(f"{case_name}/{wiring}: the reference raised while describing the tree's arguments "
                             f"({case.operator}): {type(exc).__name__}: {_first_line(exc)}") from exc
    want = case.arg_specs(*probe)
    got_sig = [(a.name, a.direction, a.dtype, a.scalar) for a in rec.args]
    want_sig = [(a.name, a.direction, a.dtype, a.scalar) for a in want]
    if got_sig != want_sig:
        first = next((i for i, (g, w) in enumerate(zip(got_sig, want_sig, strict=False)) if g != w),
                     min(len(got_sig), len(want_sig)))
        g = got_sig[first] if first < len(got_sig) else "nothing"
        w = want_sig[first] if first < len(want_sig) else "nothing"
        raise GoldenStoreError(f"{path}: stored argument spec disagrees with operator {case.operator}: argument "
                               f"{first} is {g}, expected {w} (name, direction, dtype, scalar)")
    wanted = [(f"{path}/in/{a.name}", a, "in") for a in rec.args if a.is_input] + \
             [(f"{path}/out/{a.name}", a, "out") for a in rec.args if a.is_output]
    data = reader.read_many([p for p, _a, _k in wanted])
    for p, _spec, _kind in wanted:
        rel = p[len(path) + 1:]
        if data[p][1].get("digest") != rec.arrays.get(rel):
            raise GoldenStoreError(f"{p}: content digest {data[p][1].get('digest')} is not the one its tree record "
                                   f"lists ({rec.arrays.get(rel)}); the tree was changed outside goldens: record it again")
    inputs, expected = {}, {}
    for p, spec, kind in wanted:
        (inputs if kind == "in" else expected)[spec.name] = _as_tensor(p, *data[p], spec)
    moved = what_moved(case, rec)
    return LoadedTree(case, rec, inputs, expected, bool(moved), moved)


def what_moved(case: Case, rec: TreeRecord) -> tuple[str, ...]:
    """What changed in the reference since ``rec`` was recorded (empty: the tree is current), from the record
    alone: the fingerprint parts, of a rule table only the entries the tree read."""
    now = fingerprint_parts(case, set(rec.fingerprint_parts))
    if rec.fingerprint == combined(now):
        return ()
    return tuple(changes(rec.fingerprint_parts, now)) or ("the reference fingerprint (recorded without its parts)",)


def staleness(reader: StoreReader, case_name: str, wiring: str) -> tuple[str, ...]:
    """``what_moved`` of a stored tree, reading its record only (no array)."""
    adopt(reader, case_name)
    path = tree_path(case_name, wiring)
    return what_moved(get_case(case_name), TreeRecord.from_attrs(reader.group_attrs(path), where=path))


_PROBES: dict[tuple[str, str], tuple[dict, dict]] = {}


def _spec_probe(case: Case, wiring: str) -> tuple[dict, dict]:
    """Inputs/outputs of seed 0 (tiny, built once per process), used only for names, order, directions
    and dtypes -- never as replay data."""
    if case.base:  # a derived case (counterexample) has its base case's arguments
        return _spec_probe(get_case(case.base), wiring)
    key = (case.name, wiring)
    if key not in _PROBES:
        inputs = case.build_inputs(0, wiring)
        outputs = _reference_run(case, inputs, wiring)[0]
        # kept as shapes and dtypes only (meta tensors): a model-geometry case's tensors run to gigabytes
        _PROBES[key] = tuple({k: _meta(v) for k, v in d.items()} for d in (inputs, outputs))
    return _PROBES[key]


def _meta(t):
    return torch.empty(t.shape, dtype=t.dtype, device="meta") if isinstance(t, torch.Tensor) else t


def _as_tensor(path: str, arr, attrs: dict, spec: ArgSpec) -> torch.Tensor:
    t = from_numpy(arr, attrs, name=path)
    if tuple(t.shape) != tuple(spec.shape) or str(t.dtype).removeprefix("torch.") != spec.dtype:
        raise GoldenStoreError(f"{path}: stored {t.dtype}{list(t.shape)} disagrees with the tree spec "
                               f"{spec.dtype}{list(spec.shape)}")
    return t


def replay(tree: LoadedTree, backend, *, allow_stale: bool = False, keep: dict | None = None
           ) -> dict[str, CheckResult]:
    """Run ``backend`` on the stored inputs and judge each output with its comparator (``keep``, when given,
    receives the actual outputs). A device backend with its own ``replay`` (pypto) replays upstream's way:
    the tree exported as ``golden_data`` and the kernel's outputs captured through ``compare_fn``."""
    if tree.stale and not allow_stale:
        raise GoldenStoreError(f"{tree.case.name}/{tree.record.wiring} is stale: {tree.stale_reason()}")
    recorded = tree.record.upstream.get("variants", {}) if tree.record.upstream else {}
    folder = (getattr(backend, "provenance", None) or {}).get("folder")
    if tree.record.upstream and folder and tree.record.upstream.get("folder", "deepseek_v4_pro") != folder:
        # upstream's goldens of one model folder against another folder's numbers: the folders' own disagreements
        # (docs/upstream.md), not this backend's error; judged by the backend of the folder that recorded them
        raise Unsupported(f"{tree.case.name}/{tree.record.wiring} holds the numbers of models/"
                          f"{tree.record.upstream.get('folder', 'deepseek_v4_pro')}'s goldens; backend "
                          f"{getattr(backend, 'name', backend)!r} runs models/{folder}'s")
    deviations = getattr(backend, "deviations", {})
    for name in tree.case.deviations:  # the backend departs from what this case's numbers assume, by name
        if name in deviations:
            raise Unsupported(f"{tree.case.name}/{tree.record.wiring} is not a judge of backend "
                              f"{getattr(backend, 'name', backend)!r}: named deviation {name}: {deviations[name]}")
    for op in tree.case.operator.split("+"):  # a backend following another named rule than the tree's: not judged
        follows = getattr(backend, "variants", {}).get(op)
        if follows and follows != recorded.get(op):
            raise Unsupported(f"backend {getattr(backend, 'name', backend)!r} follows {follows} for {op} by name; "
                              f"{tree.case.name}/{tree.record.wiring} holds the numbers of "
                              f"{recorded.get(op) or 'the default rules'}")
    try:
        own = getattr(backend, "replay", None)  # a device backend replays upstream's way, from golden_data
        actual = own(tree, lambda directory: export_pt_tree(tree, directory)) if own is not None else None
        if actual is None:
            actual = tree.case.run(backend, _clone(tree.inputs), tree.record.wiring)
    except (MissingOperator, Unsupported):
        raise  # the backend lacks the operator, or cannot run this call: skipped with that reason, not judged
    except Exception as exc:
        first = str(exc).splitlines()[0][:300] if str(exc) else ""
        raise BackendFailure(f"{tree.case.name}/{tree.record.wiring}: backend {getattr(backend, 'name', backend)!r} "
                             f"raised in {tree.case.operator}: {type(exc).__name__}: {first}") from exc
    if keep is not None:
        keep.update(actual)
    ctx = Context(tree.inputs, actual, tree.expected, tree.record.params, tree.record.wiring)
    try:
        return compare_all(tree.record.comparators, ctx)
    except Exception as exc:  # a comparator that cannot judge this tree (a missing param, a shape it does not take)
        raise BackendFailure(f"{tree.case.name}/{tree.record.wiring}: a comparator raised judging it "
                             f"({', '.join(sorted(set(tree.record.comparators.values())))}): {type(exc).__name__}: "
                             f"{_first_line(exc)}") from exc




def keep_actual(store: GoldenStore, backend, replayed: str, kept: dict[tuple[str, str], dict], verdicts: dict,
                inputs: dict[tuple[str, str], str] | None = None, *, run_id: str | None = None) -> CommitResult:
    """Commit the actual outputs of a replay beside the trees (``actual/<backend>-<platform>/<case>/<wiring>/``),
    one commit, so ``goldens diff`` shows them against earlier kept runs and ``--backend recorded`` judges them
    again; the expected outputs are untouched. Each run records the backend's provenance (toolchain, upstream
    commits) and the digest of the inputs it ran on (``inputs``: (case, wiring) -> ``recorded.inputs_digest``).

    ``run_id`` (a distributed replay's, given to every task): a tree whose kept run the branch head already holds
    under this id is left alone -- decided inside the commit, on its base -- so a task run again after its node
    died, or a task that finished twice, keeps each tree once."""
    import json

    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{backend.name}-{backend.platform}").strip("-")
    provenance = dict(getattr(backend, "provenance", None) or {})
    if callable(getattr(backend, "toolchain", None)):  # a device backend: what it ran on, asked once per kept run
        provenance["toolchain"] = backend.toolchain()
    provenance = json.loads(json.dumps(provenance, default=str))
    arrays, groups = {}, {}
    for (case, wiring), outputs in kept.items():
        base = f"{ACTUAL_ROOT}/{slug}/{case}/{wiring}"
        groups[base] = {"backend": backend.name, "platform": backend.platform, "replayed_snapshot": replayed,
                        "case": case, "wiring": wiring, "verdicts": verdicts.get((case, wiring), {}),
                        "inputs_digest": (inputs or {}).get((case, wiring)), "provenance": provenance,
                        **({"run_id": run_id} if run_id else {})}
        for name, t in outputs.items():
            arrays[f"{base}/{name}"] = to_numpy(t.detach().cpu().contiguous())
    message = f"keep-actual {backend.name} ({backend.platform}) replay of {replayed[:12]}" + \
        (f" (run {run_id})" if run_id else "")
    if not run_id:
        return store.commit(arrays, groups, message, metadata={"action": "keep-actual"})

    def body(txn):
        done = {b for b in groups if txn.reader.has(b) and txn.reader.group_attrs(b).get("run_id") == run_id}
        txn.write({k: v for k, v in arrays.items() if k.rsplit("/", 1)[0] not in done},
                  {b: a for b, a in groups.items() if b not in done})
        return sorted(set(groups) - done)

    _kept, result = store.update(body, message, metadata=lambda kept: {"action": "keep-actual", "run_id": run_id,
                                                                         "kept": kept})
    return result


@dataclass(frozen=True)
class OutputDelta:
    name: str
    elements_changed: int
    elements: int
    max_abs: float
    mean_abs: float
    max_rel: float
    rows_affected: int


def _cache_rows(t: torch.Tensor) -> torch.Tensor:
    """A cache [blocks, rows, 1, width] viewed as its physical rows [blocks·rows, width] (spec §2.3); any
    other tensor as [dim 0, rest]."""
    if t.ndim == 4 and t.shape[2] == 1:
        return t.reshape(t.shape[0] * t.shape[1], -1)
    return t.reshape(t.shape[0], -1) if t.ndim else t.reshape(1, 1)


def _fp4_values(packed: torch.Tensor) -> torch.Tensor:
    """Packed E2M1 pairs -> their element values (the last dim doubles; spec §2.2)."""
    from kernels import quant

    return quant.e2m1_decode(quant.unpack_fp4(packed))



def delta(name: str, old: torch.Tensor, new: torch.Tensor) -> OutputDelta:
    """Summary of an output change: elements changed and rows affected (a cache's rows are its physical
    block rows, not its blocks); for floating outputs also max/mean absolute and max relative difference
    (FP64). A packed FP4 payload (uint8 ``payload`` / ``<cache>_payload``) is decoded to its E2M1 element
    values first, so it reports elements and value changes in the format's units (the group scale is a
    separate output). Integer outputs report counts only (NaN)."""
    if old.shape != new.shape or old.dtype != new.dtype:
        return OutputDelta(name, new.numel(), new.numel(), math.inf, math.inf, math.inf,
                           _cache_rows(new).shape[0])
    from contracts.evidence import is_packed_fp4

    if is_packed_fp4(name, old):
        from kernels import quant

        codes_changed = quant.unpack_fp4(old) != quant.unpack_fp4(new)  # -0 and +0 are different codes
        old, new = _fp4_values(old), _fp4_values(new)
    else:
        codes_changed = None
    numeric = old.dtype.is_floating_point  # int metadata: count elements only
    a, b = old.to(torch.float32).to(torch.float64), new.to(torch.float32).to(torch.float64)
    changed = (a != b) & ~(a.isnan() & b.isnan()) if codes_changed is None else codes_changed
    n = int(changed.sum())
    if n == 0:
        return OutputDelta(name, 0, a.numel(), 0.0, 0.0, 0.0, 0)
    rows = int(_cache_rows(changed).any(1).sum())
    if not numeric:
        return OutputDelta(name, n, a.numel(), math.nan, math.nan, math.nan, rows)
    diff = (a - b).abs()[changed]
    rel = diff / a.abs()[changed].clamp_min(1e-300)
    return OutputDelta(name, n, a.numel(), float(diff.max()), float(diff.mean()), float(rel.max()), rows)


@dataclass(frozen=True)
class Change:
    """How the current reference's outputs on a tree's stored inputs differ from its stored expected ones."""

    kind: str  # "none" | "rounding" (every moved output within its comparator, or one step of its format) | "beyond"
    detail: str = ""
    outputs: dict = field(default_factory=dict)  # each moved output's own kind: "rounding" | "beyond"

    def of(self, output: str) -> str:
        """This output's own change: "none" when it did not move."""
        return self.outputs.get(output, "none")


def _ordinals(t: torch.Tensor, name: str) -> torch.Tensor:
    """Each element's position on its format's ladder of values (int64): a float's (contracts.evidence.ordered),
    a packed FP4 pair's two E2M1 codes as sign-magnitude, an integer its value."""
    from contracts.evidence import is_packed_fp4, ordered

    if is_packed_fp4(name, t):
        from kernels import quant

        codes = quant.unpack_fp4(t).long()
        return torch.where(codes & 8 != 0, -(codes & 7), codes & 7)
    if t.dtype.is_floating_point:
        return ordered(t)
    return t.long()


def _steps(name: str, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor | None:
    """Per element, how many steps of its format (ULPs of its dtype, FP4 codes, integer units) the new value is
    from the stored one; NaN to NaN is 0, NaN to a number counts as far. None when shape or dtype changed."""
    if old.shape != new.shape or old.dtype != new.dtype:
        return None
    steps = (_ordinals(old, name) - _ordinals(new, name)).abs()
    if old.dtype.is_floating_point:
        steps = torch.where(old.isnan() & new.isnan(), torch.zeros_like(steps), steps)
        steps = torch.where(old.isnan() ^ new.isnan(), torch.full_like(steps, 2**62), steps)
    return steps


def _unit_sized(name: str, old: torch.Tensor, new: torch.Tensor) -> bool:
    """Every element at most one step of its format from the stored one (the neighbouring float of its dtype, the
    neighbouring FP4 code, an integer +-1): what a rounding change moves; NaN stays NaN."""
    steps = _steps(name, old, new)
    return steps is not None and bool((steps <= 1).all())


def _how_far(name: str, old: torch.Tensor, new: torch.Tensor) -> str:
    """'payload: 3/128 elements, at most 1 step' (steps: ULPs of the dtype, FP4 codes, integer units)."""
    steps = _steps(name, old, new)
    if steps is None:
        return f"{name}: shape or dtype changed"
    moved = int((steps > 0).sum())
    fp4 = steps.numel() != old.numel()  # packed E2M1: two codes a byte
    unit = "FP4 code" if fp4 else ("ulp" if old.dtype.is_floating_point else "unit")
    top = int(steps.max()) if steps.numel() else 0
    return (f"{name}: {moved}/{steps.numel()} {'codes' if fp4 else 'elements'}, at most {top} "
            f"{unit}{'s' if top != 1 else ''}")


def classify_change(tree: LoadedTree, outputs: dict) -> Change:
    """A rounding change keeps every output within the tree's own comparator of the stored expected outputs (a
    kernel that matched the old goldens still matches the new ones), or moves it by at most one unit of its dtype;
    anything else is a rule change or a reference bug, and says which output moved and how."""
    from contracts.evidence import same_bytes

    moved = [k for k in tree.expected if not same_bytes(tree.expected[k], outputs[k])]
    if not moved:
        return Change("none")
    try:
        verdicts = compare_all({k: tree.record.comparators[k] for k in moved},
                               Context(tree.inputs, outputs, tree.expected, tree.record.params, tree.record.wiring))
    except Exception as exc:  # a comparator that cannot judge the new outputs: not a rounding change
        verdicts = {k: None for k in moved}
        why = f"{type(exc).__name__}: {exc}"
    beyond, kinds = [], {}
    for k in moved:
        r = verdicts.get(k)
        if (r is not None and r.ok) or _unit_sized(k, tree.expected[k], outputs[k]):
            kinds[k] = "rounding"
            continue
        kinds[k] = "beyond"
        d = delta(k, tree.expected[k], outputs[k])
        size = (f"{d.elements_changed}/{d.elements} elements in {d.rows_affected} rows, max rel {d.max_rel:.3g}"
                if not math.isnan(d.max_rel) else f"{d.elements_changed}/{d.elements} elements in {d.rows_affected} rows")
        cause = r.message().splitlines()[0][:140] if r is not None else why
        beyond.append(f"{k} ({size}; {tree.record.comparators[k]}: {cause})")
    if not beyond:
        return Change("rounding", "; ".join(_how_far(k, tree.expected[k], outputs[k]) for k in moved)
                      + " (within the comparators, or one step)", kinds)
    return Change("beyond", "; ".join(beyond), kinds)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def reference_outputs(tree: LoadedTree, read: set[str] | None = None) -> dict:
    """The current reference on the tree's stored inputs (the rule-table entries it looks up are added to
    ``read``); a reference that raises is a BackendFailure naming the tree (exit 3), never a traceback."""
    try:
        out, seen = _reference_run(tree.case, tree.inputs, tree.record.wiring)
        if read is not None:
            read |= seen
        return out
    except (GoldenStoreError, MissingOperator, Unsupported):
        raise
    except Exception as exc:
        raise BackendFailure(f"{tree.case.name}/{tree.record.wiring}: the current reference raised on the stored "
                             f"inputs ({tree.case.operator}): {type(exc).__name__}: {_first_line(exc)}") from exc


def _regen_trees(reader: StoreReader, items: list[tuple[str, str]], *, accept: bool = True):
    report, arrays, groups = [], {}, {}
    refused = []
    for name, wiring in items:
        tree = load_tree(reader, name, wiring)
        read: set[str] = set()
        outputs = reference_outputs(tree, read)
        deltas = [delta(k, tree.expected[k], outputs[k]) for k in tree.expected]
        change = classify_change(tree, outputs)
        if change.kind == "beyond" and not accept:
            refused.append(f"{name}/{wiring}: {change.detail}")
        report.append((name, wiring, [d for d in deltas if d.elements_changed], change))
        rec = make_record(tree.case, wiring, tree.record.seed, tree.inputs, outputs, source=tree.record.source,
                          read=read)
        arrays.update(tree_arrays(tree.case, rec, tree.inputs, outputs))
        groups[tree_path(name, wiring)] = rec.to_attrs()
    if refused:
        raise RuleChange(refused)
    return report, arrays, groups


def regen(store: GoldenStore, items: list[tuple[str, str]], *, dry_run: bool = False, reason: str | None = None,
          accept_rule_change: bool = False) -> tuple[list[tuple[str, str, list[OutputDelta], Change]],
                                                      CommitResult | None]:
    """Recompute expected outputs from stored inputs with the current reference; commit only changed
    arrays (and the new fingerprint) in one tagged commit. The trees are read as the commit's base (under the
    lock, or rerun when an S3 commit finds the branch moved), so a record or import committed meanwhile is
    never overwritten by stale trees. A tree whose outputs would move past their comparators (``classify_change``:
    a rule change or a reference bug, never rounding) is refused, nothing committed (``RuleChange``), unless
    ``accept_rule_change``; a dry run reports each tree's change without refusing."""
    if dry_run:
        report, _arrays, _groups = _regen_trees(store.reader(), items)
        return report, None
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")

    def body(txn):
        report, arrays, groups = _regen_trees(txn.reader, items, accept=accept_rule_change)
        txn.write(arrays, groups)
        return report

    label = "regen " + ", ".join(f"{c}/{w}" for c, w in items[:6]) + (f" (+{len(items) - 6} more)" if len(items) > 6
                                                                        else "")

    def message(report_) -> str:  # the snapshot says what moved (and why, with -m)
        moved = [f"{c}/{w}:{d.name}" for c, w, ds, _ch in report_ for d in ds]
        what = (f"outputs moved: {', '.join(moved[:8])}" + (f" (+{len(moved) - 8} more)" if len(moved) > 8 else "")
                if moved else "no output moved (fingerprints only)")
        accepted = [f"{c}/{w}" for c, w, _ds, ch in report_ if ch.kind == "beyond"]
        past = f"; accepted past their comparators: {', '.join(accepted)}" if accepted else ""
        return f"{label}; {what}{past}" + (f"; reason: {reason}" if reason else "")

    report, result = store.update(body, message, metadata={"action": "regen", **({"reason": reason} if reason else {})},
                                  tag=f"{REGEN_TAG_PREFIX}{stamp}")
    return report, result


# ---------------------------------------------------------------------------
# upstream .pt layout: <dir>/<wiring>/in/<name>.pt and <dir>/<wiring>/out/<name>.pt


def _safe_save(tensor: torch.Tensor, path: Path, root: Path) -> None:
    """torch.save into ``path`` without following anything out of ``root``: the directory chain must resolve
    inside it, an existing entry must be a regular file, and the file is replaced atomically (a symlink
    planted at the name is replaced, never written through)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    top = root.resolve()
    if not path.parent.resolve().is_relative_to(top):
        raise GoldenStoreError(f"{path.parent}: resolves outside the export directory {root}; refusing to write")
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise GoldenStoreError(f"{path}: exists and is not a regular file (a symlink or special file); "
                               "refusing to write through it")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(tensor, tmp)
    os.replace(tmp, path)


def export_pt(reader: StoreReader, case_name: str, wiring: str, directory: Path) -> list[Path]:
    """Upstream's replay layout for one wiring: ``<directory>/<wiring>/{in,out}/<name>.pt`` (spec §7.2)."""
    return export_pt_tree(load_tree(reader, case_name, wiring), directory / wiring,
                          root=directory)


def export_pt_tree(tree: LoadedTree, data_dir: Path, *, root: Path | None = None) -> list[Path]:
    """One tree as upstream's ``golden_data`` directory: ``in/<name>.pt`` for every input and scalar (a 0-dim
    tensor), ``out/<name>.pt`` for every output; an InOut argument has both (spec §7.3)."""
    written = []
    for spec in tree.record.args:
        for kind, source in (("in", tree.inputs), ("out", tree.expected)):
            if (kind == "in" and spec.is_input) or (kind == "out" and spec.is_output):
                path = data_dir / kind / f"{spec.name}.pt"
                _safe_save(source[spec.name].clone(), path, root or data_dir)
                written.append(path)
    return written


SCALAR_CEILING = 2**20  # no scalar a tree needs (positions, capacities, counts) exceeds max_position_embeddings
ELEMENT_CEILING = 2**27  # elements per imported tensor (512 MiB of FP32): a tree is a small replay problem


def _load_pt(path: Path) -> torch.Tensor:
    """One plain, dense, CPU tensor from a regular file (never a FIFO, device or symlink), read with
    torch.load(weights_only=True)."""
    try:
        st = path.lstat()
    except OSError as exc:
        raise GoldenStoreError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise GoldenStoreError(f"{path}: refused: {kind} (only regular .pt files are read)")
    if st.st_size == 0:
        raise GoldenStoreError(f"{path}: refused: empty file (0 bytes)")
    try:
        value = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # weights_only refuses arbitrary pickled objects
        raise GoldenStoreError(f"{path}: refused: not a plain tensor file loadable with weights_only=True "
                               f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})") from None
    if not isinstance(value, torch.Tensor):
        raise GoldenStoreError(f"{path}: refused: holds a {type(value).__name__}, expected one tensor")
    if value.layout != torch.strided or value.is_meta or value.device.type != "cpu":
        raise GoldenStoreError(f"{path}: refused: a {value.layout} tensor on {value.device} (only dense CPU tensors)")
    if value.numel() > ELEMENT_CEILING:
        raise GoldenStoreError(f"{path}: refused: {value.numel()} elements, more than the {ELEMENT_CEILING} a tree "
                               "may hold")
    if value.ndim == 0 and not value.dtype.is_floating_point and abs(int(value)) > SCALAR_CEILING:
        raise GoldenStoreError(f"{path}: refused: scalar {int(value)} outside [-{SCALAR_CEILING}, {SCALAR_CEILING}]")
    return value.contiguous()


def _check_against_reference(case: Case, wiring: str, inputs: dict, outputs: dict, base: Path,
                             read: set[str]) -> dict:
    """The imported inputs must be accepted by the reference, and every imported output must have the shape
    and dtype the reference gives for those inputs (nothing is committed otherwise). Returns the reference's
    outputs; ``read`` gets the rule-table entries it looked up."""
    try:
        want, seen = _reference_run(case, inputs, wiring)
        read |= seen
    except (ValueError, IndexError, RuntimeError, TypeError) as exc:
        raise GoldenStoreError(f"{base}: inputs refused by the {case.operator} reference: "
                               f"{str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}") from None
    for name, t in outputs.items():
        w = want.get(name)
        if w is None or tuple(t.shape) != tuple(w.shape) or t.dtype != w.dtype:
            shape = "nothing" if w is None else f"{w.dtype}{list(w.shape)}"
            raise GoldenStoreError(f"{base}/out/{name}.pt: {t.dtype}{list(t.shape)}, but the reference gives "
                                   f"{shape} for these inputs")
    return want


def import_pt(store: GoldenStore, case_name: str, directory: Path, wirings: tuple[str, ...],
              warnings: list[str] | None = None) -> CommitResult:
    """Import upstream-layout trees for ``case_name``; names, directions and dtypes must match the
    operator's spec (files are read with torch.load(weights_only=True) only). An expected output that is not
    what the reference computes for those inputs is imported (it may be a device's or upstream's answer) and
    said in ``warnings``: within the tree's comparators, or past them (a replay on the reference will fail)."""
    case = get_case(case_name)
    arrays, groups = {}, {}
    for wiring in wirings:
        base = directory / wiring
        if not base.is_dir():
            raise GoldenStoreError(f"{base}: missing per-wiring directory (layout <dir>/<wiring>/in|out/<name>.pt)")
        probe_in, probe_out = _spec_probe(case, wiring)
        specs = case.arg_specs(probe_in, probe_out)
        inputs, outputs = {}, {}
        for spec in specs:
            for kind, target, wanted in (("in", inputs, spec.is_input), ("out", outputs, spec.is_output)):
                if not wanted:
                    continue
                path = base / kind / f"{spec.name}.pt"
                if not path.exists():
                    raise GoldenStoreError(f"{path}: missing file for {spec.direction} argument {spec.name!r}")
                t = _load_pt(path)
                if str(t.dtype).removeprefix("torch.") != spec.dtype:
                    raise GoldenStoreError(f"{path}: dtype {t.dtype}, operator {case.operator} expects {spec.dtype}")
                target[spec.name] = t
        extra = sorted({p.stem for p in base.glob("*/*.pt")} - {s.name for s in specs})
        if extra:
            raise GoldenStoreError(f"{base}: files not in the operator's spec: {extra}")
        for kind, wanted in (("in", {s.name for s in specs if s.is_input}),
                             ("out", {s.name for s in specs if s.is_output})):
            misplaced = sorted({p.stem for p in (base / kind).glob("*.pt")} - wanted)
            if misplaced:
                raise GoldenStoreError(f"{base / kind}: {misplaced} are not {'inputs' if kind == 'in' else 'outputs'} "
                                       f"of operator {case.operator} (they belong under "
                                       f"{'out' if kind == 'in' else 'in'}/); nothing was imported")
        for spec in specs:
            if spec.direction == "inout":
                outputs.setdefault(spec.name, inputs[spec.name])
        read: set[str] = set()
        want = _check_against_reference(case, wiring, inputs, outputs, base, read)
        rec = make_record(case, wiring, -1, inputs, outputs, source=f"import-pt {directory}", read=read)
        if warnings is not None:
            change = classify_change(LoadedTree(case, rec, inputs, outputs, False), want)
            if change.kind == "rounding":
                warnings.append(f"{case_name}/{wiring}: the imported expected outputs are not the reference's for "
                                f"these inputs, but within the tree's comparators: {change.detail}")
            elif change.kind == "beyond":
                warnings.append(f"{case_name}/{wiring}: the imported expected outputs are PAST the tree's "
                                f"comparators of what the reference computes for these inputs: {change.detail}; "
                                "`goldens replay` on the reference backend will fail this tree")
        for got, want in zip(rec.args, specs, strict=True):  # what load_tree will check, before anything is written
            if (got.name, got.direction, got.dtype, got.scalar) != (want.name, want.direction, want.dtype, want.scalar):
                shape = "a 0-dim scalar" if want.scalar else "a tensor, not a 0-dim scalar"
                held = (inputs if want.is_input else outputs).get(want.name)
                held_shape = f" of shape {list(held.shape)}" if held is not None else ""
                raise GoldenStoreError(f"{base}/{'in' if want.is_input else 'out'}/{want.name}.pt: the operator "
                                       f"{case.operator} takes {shape} {want.dtype} here; the file holds "
                                       f"{got.dtype}{held_shape}{' (0-dim)' if got.scalar else ''}: nothing was "
                                       "imported")
        arrays.update(tree_arrays(case, rec, inputs, outputs))
        groups[tree_path(case_name, wiring)] = rec.to_attrs()

    def body(txn):
        for path, attrs in list(groups.items()):  # the same bytes already stored: keep that record (a no-op)
            if txn.reader.has(path):
                old = txn.reader.group_attrs(path)
                if _same_content(old, attrs):
                    groups[path] = old
        txn.write(arrays, groups)

    _none, result = store.update(body, f"import-pt {case_name} from {directory}", metadata={"action": "import-pt"})
    return result


def diff_revisions(store: GoldenStore, rev_a: str, rev_b: str) -> list[tuple[str, str, OutputDelta | str | None]]:
    """(path, 'added'|'removed'|'changed', delta) for every array that differs between two revisions, then
    (tree, 'attrs', what changed) for every tree whose record changed: fingerprint parts, tolerances,
    comparators, seed, versions, source."""
    ra, rb = store.reader(rev_a), store.reader(rev_b)
    pa, pb = set(ra.walk_arrays()), set(rb.walk_arrays())
    out = [(p, "added", None) for p in sorted(pb - pa)] + [(p, "removed", None) for p in sorted(pa - pb)]
    for case in sorted(set(recorded_cases(ra)) & set(recorded_cases(rb))):
        for wiring in sorted(set(recorded_wirings(ra, case)) & set(recorded_wirings(rb, case))):
            detail = _record_changes(ra.group_attrs(f"{case}/{wiring}"), rb.group_attrs(f"{case}/{wiring}"))
            if detail:
                out.append((f"{case}/{wiring}", "attrs", detail))
    for p in sorted(pa & pb):
        if ra.array_attrs(p).get("digest") == rb.array_attrs(p).get("digest"):
            continue
        (xa, aa), (xb, ab) = ra.read(p), rb.read(p)
        out.append((p, "changed", delta(p, from_numpy(xa, aa, name=p), from_numpy(xb, ab, name=p))))
    return out

