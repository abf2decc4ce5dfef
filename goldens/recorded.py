"""``--backend recorded[:SOURCE]``: a device's outputs kept by ``goldens replay --keep-actual`` (e.g. the upstream
kernels on the a5 simulator), judged again -- with the current comparators, against the current expected
outputs -- on a machine without that device or toolchain (CI).

A kept run lives beside the trees at ``actual/<source>/<case>/<wiring>/<output>``; its group records the backend,
platform and provenance (toolchain and upstream commits) and a digest of the tree inputs it ran on. A tree with
no kept outputs of the source is a named skip; one whose inputs changed since the run (re-recorded) too: the kept
outputs are never judged against inputs they did not come from.
"""

from __future__ import annotations

import hashlib

import torch

from contracts.operators import MissingOperator, Unsupported
from goldens.catalog import ACTUAL_ROOT
from goldens.codec import from_numpy, to_numpy
from goldens.errors import GoldenStoreError
from goldens.store_read import StoreReader
from goldens.trees import LoadedTree, _reference_run, load_tree, make_record
from kernels.errors import is_int


def inputs_digest(inputs: dict[str, torch.Tensor]) -> str:
    """One hash of a tree's inputs (names, logical dtypes, shapes, bytes), in name order."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(inputs):
        arr, attrs = to_numpy(inputs[name])
        h.update(f"{name}|{attrs['dtype']}|{attrs['shape']}|".encode())
        h.update(arr.reshape(-1).view("uint8").data if arr.size else b"")
    return h.hexdigest()


def sources(reader: StoreReader) -> list[str]:
    """The sources (``<backend>-<platform>``) with kept outputs in this snapshot."""
    return reader.groups(ACTUAL_ROOT)


class RecordedBackend:
    """The kept outputs of one source, as a replay-only backend (``replay`` hook; no operator runs)."""

    def __init__(self, reader: StoreReader, source: str):
        self.reader, self.source = reader, source
        self.name, self.platform = f"recorded:{source}", "cpu"
        self.variants: dict = {}
        self.description = f"outputs of {source} kept by goldens replay --keep-actual"

    def get(self, op: str):
        raise MissingOperator(f"backend {self.name!r} replays kept outputs only: it runs no operator ({op})")

    def replay(self, tree, export) -> dict[str, torch.Tensor]:
        base = f"{ACTUAL_ROOT}/{self.source}/{tree.case.name}/{tree.record.wiring}"
        if not self.reader.has(base):
            raise Unsupported(f"no outputs of {self.source} kept for {tree.case.name}/{tree.record.wiring}")
        attrs = self.reader.group_attrs(base)
        kept_for = attrs.get("inputs_digest")
        if kept_for != inputs_digest(tree.inputs):
            raise Unsupported(f"the outputs of {self.source} kept for {tree.case.name}/{tree.record.wiring} ran on "
                              "other inputs (the tree was re-recorded since, or the run predates input digests): "
                              "replay on the device again with --keep-actual")
        out = {}
        for name in tree.record.comparators:
            path = f"{base}/{name}"
            if not self.reader.has(path):
                raise GoldenStoreError(f"{path}: kept run has no output {name!r}")
            arr, a = self.reader.read(path)
            out[name] = from_numpy(arr, a, name=path)
        return out


def recorded_backend(reader: StoreReader, spec: str) -> RecordedBackend:
    """``recorded`` (the only source kept) or ``recorded:SOURCE``."""
    have = sources(reader)
    source = spec.partition(":")[2]
    if not source:
        if len(have) != 1:
            raise GoldenStoreError(f"--backend recorded needs a source: recorded:SOURCE, one of {have or 'none kept'}")
        source = have[0]
    if source not in have:
        raise GoldenStoreError(f"no kept outputs of {source!r} in this store (kept: {have or 'none'}; goldens replay "
                               "--backend pypto --platform a5sim --keep-actual keeps them)")
    return RecordedBackend(reader, source)


# --- kept runs whose tree is not in this store: the inputs rebuilt from the case, the expected outputs computed ---
# A device run at a kernel's own geometry (goldens.cases.pro: 10-120 MB of inputs a tree) is kept where it ran (a
# store of the user's); `goldens import-kept` copies its outputs alone into another store (the sample store) with
# how to rebuild its inputs (the case module and seed). Replaying them rebuilds the inputs, refuses to judge unless
# their digest is the one the device ran on, and computes the expected outputs with the current reference.
REBUILD = "rebuild"
# case modules that moved since a recipe may have named them: old name -> where they live now
MOVED_CASE_MODULES = {"goldens.cases_pro": "goldens.cases.pro", "goldens.cases_v4_ops": "goldens.cases.records",
                      "goldens.cases.v4_ops": "goldens.cases.records"}


def kept_runs(reader: StoreReader, source: str) -> list[tuple[str, str, dict]]:
    """(case, wiring, attributes) of every kept run of ``source`` in this snapshot."""
    root = f"{ACTUAL_ROOT}/{source}"
    return [(case, wiring, reader.group_attrs(f"{root}/{case}/{wiring}"))
            for case in (reader.groups(root) if reader.has(root) else [])
            for wiring in reader.groups(f"{root}/{case}")]


def rebuilt_items(reader: StoreReader, source: str) -> list[tuple[str, str]]:
    """(case, wiring) of the kept runs of ``source`` that carry a rebuild recipe instead of a tree."""
    return [(case, wiring) for case, wiring, attrs in kept_runs(reader, source) if REBUILD in attrs]


def _recipe_case(recipe: dict, case_name: str, where: str):
    import importlib

    from goldens.cases import get_case

    module = recipe.get("cases_module")
    module = MOVED_CASE_MODULES.get(module, module)
    if not isinstance(module, str) or not module.startswith("goldens."):
        raise GoldenStoreError(f"{where}: rebuild recipe names cases module {module!r} (expected goldens.*)")
    try:
        importlib.import_module(module)
        return get_case(case_name)
    except GoldenStoreError:
        raise
    except Exception as exc:
        raise GoldenStoreError(f"{where}: cannot load case {case_name} from {module}: {type(exc).__name__}: {exc}") \
            from None


def rebuild_tree(reader: StoreReader, source: str, case_name: str, wiring: str):
    """The tree a kept run of ``source`` ran on, rebuilt here: its inputs from the case's builder and seed (their
    digest must be the kept run's, else Unsupported: never judged against other inputs), its expected outputs
    from the current reference, its comparators the case's current ones."""
    where = f"{ACTUAL_ROOT}/{source}/{case_name}/{wiring}"
    attrs = reader.group_attrs(where)
    recipe = attrs.get(REBUILD)
    if not isinstance(recipe, dict) or not is_int(recipe.get("seed")):
        raise GoldenStoreError(f"{where}: no usable rebuild recipe ({recipe!r})")
    case = _recipe_case(recipe, case_name, where)
    inputs = case.build_inputs(recipe["seed"], wiring)
    if inputs_digest(inputs) != attrs.get("inputs_digest"):
        raise Unsupported(f"{case_name}/{wiring}: the inputs {recipe['cases_module']} builds here (seed "
                          f"{recipe['seed']}) are not the ones {source} ran on (digest {inputs_digest(inputs)} vs "
                          f"{attrs.get('inputs_digest')}): the case's builder changed since the run; replay on the "
                          "device again and import the kept run again")
    expected = _reference_run(case, inputs, wiring)[0]  # the outputs judged at the case's geometry
    record = make_record(case, wiring, recipe["seed"], inputs, expected, source="rebuilt")
    return LoadedTree(case, record, inputs, expected, False)


def import_kept(store, from_reader: StoreReader, source: str, items: list[tuple[str, str]], cases_module: str):
    """Copy the kept outputs of ``source`` for ``items`` from another store (``from_reader``, where their trees
    are) into ``store`` with a rebuild recipe (``cases_module``, the tree's seed), one commit. Refused, nothing
    written, when a tree is stale there, when the kept run ran on other inputs than its tree's, or when the
    builder here does not give those inputs again."""
    arrays, groups = {}, {}
    for case_name, wiring in items:
        base = f"{ACTUAL_ROOT}/{source}/{case_name}/{wiring}"
        if not from_reader.has(base):
            raise GoldenStoreError(f"no outputs of {source} kept for {case_name}/{wiring} in the source store")
        attrs = dict(from_reader.group_attrs(base))
        tree = load_tree(from_reader, case_name, wiring)
        if tree.stale:
            raise GoldenStoreError(f"{case_name}/{wiring} is stale in the source store ({tree.stale_reason()}); "
                                   "regenerate it there, replay on the device again, then import")
        if attrs.get("inputs_digest") != inputs_digest(tree.inputs):
            raise GoldenStoreError(f"{base}: the kept run ran on other inputs than the tree in the source store "
                                   "(re-recorded since): replay on the device again with --keep-actual")
        rebuilt = tree.case.build_inputs(tree.record.seed, wiring)
        if inputs_digest(rebuilt) != attrs["inputs_digest"]:
            raise GoldenStoreError(f"{case_name}/{wiring}: {cases_module} does not rebuild the inputs the run was "
                                   f"kept for (seed {tree.record.seed}); not imported")
        attrs[REBUILD] = {"cases_module": cases_module, "seed": tree.record.seed,
                          "from_snapshot": from_reader.snapshot}
        groups[base] = attrs
        for name in tree.record.comparators:
            arr, a = from_reader.read(f"{base}/{name}")
            arrays[f"{base}/{name}"] = to_numpy(from_numpy(arr, a, name=f"{base}/{name}"))
    return store.commit(arrays, groups, f"import-kept {source}: {', '.join(c for c, _w in items)}",
                        metadata={"action": "import-kept"})
