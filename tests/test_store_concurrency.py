"""Concurrent read-modify-writes on one store lose nothing: record, regen and import-pt run from several
threads (each with its own store handle, so each takes the file lock like a separate process would, or on S3
commits optimistically) in hundreds of interleavings; afterwards the head holds, for every tree, the content
of the last commit that wrote it, and every tree is self-consistent (its expected outputs are the
reference's on its inputs). The same test runs on a local store and on S3 (the local test server).
Spec: §7.3; issue: the golden store as a trusted engine."""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from goldens import trees
from goldens.codec import to_numpy
from goldens.store import GoldenStore
from goldens.store_format import digest

CASES = ("rope_rows", "sp_slabs")


def _input_digests(reader, case: str, wiring: str) -> dict[str, str]:
    base = f"{case}/{wiring}/in"
    return {p: reader.array_attrs(p)["digest"] for p in reader.walk_arrays(base)}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_record_regen_and_import_interleave_without_losing_a_commit(where, tmp_path, monkeypatch, request):
    """(regen is slowed by 20 ms between reading its trees and writing them, so a base read outside the lock
    -- or an S3 commit that did not rerun on a moved branch -- would be overtaken by other commits in most
    interleavings.)"""
    slow = trees._regen_trees

    def regen_trees_slowly(reader, items, **kwargs):
        out = slow(reader, items, **kwargs)
        time.sleep(0.02)
        return out

    monkeypatch.setattr(trees, "_regen_trees", regen_trees_slowly)
    root = tmp_path / "store" if where == "local" else request.getfixturevalue("s3_store")
    initial = trees.record(GoldenStore(root), [(c, "replicated") for c in CASES], seed=1)
    exports = {}
    for seed in (101, 102, 103):
        staging = GoldenStore(tmp_path / f"staging{seed}")
        trees.record(staging, [(c, "replicated") for c in CASES], seed=seed)
        for case in CASES:
            out = tmp_path / f"pt{seed}" / case
            trees.export_pt(staging.reader(), case, "replicated", out)
            exports[(case, seed)] = (out, _input_digests(staging.reader(), case, "replicated"))
    done: list[tuple[str, str, str, dict]] = []  # (snapshot, op, case, expected input digests)
    lock = threading.Lock()
    errors = []
    retries = []

    def worker(worker_id: int, ops: int) -> None:
        rng = random.Random(worker_id)
        store = GoldenStore(root)
        try:
            for _ in range(ops):
                case = rng.choice(CASES)
                kind = rng.choice(("record", "regen", "import"))
                if kind == "record":
                    seed = rng.randint(1000, 10**6)
                    result = trees.record(store, [(case, "replicated")], seed=seed)
                    want = ("record", seed)
                elif kind == "regen":
                    _report, result = trees.regen(store, [(case, "replicated")])
                    want = None
                else:
                    seed = rng.choice((101, 102, 103))
                    result = trees.import_pt(store, case, exports[(case, seed)][0], ("replicated",))
                    want = ("import", seed)
                if result is not None and result.snapshot is not None:
                    with lock:
                        done.append((result.snapshot, kind, case, want))
        except Exception as exc:  # surfaced below with the worker id
            errors.append((worker_id, repr(exc)))
        retries.append(store.retries)

    # 60 operations in CI time, on either store (the local test server is slow per request); the first full runs
    # used 210 of each and passed the same way, and a regen reading its base outside the lock (or an S3 commit
    # that does not rerun on a moved branch) fails this at 60 as it did at 120 and 90
    per_worker = 20
    threads = [threading.Thread(target=worker, args=(i, per_worker)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    store = GoldenStore(root)
    order = [e.snapshot for e in reversed(store.log())]  # oldest first
    ops = {snap: (kind, case, want) for snap, kind, case, want in done}
    assert all(snap in set(order) for snap in ops), "a commit is missing from the branch history"
    # about a third of the operations are records (always a commit); regens and repeated imports that change
    # nothing make no commit
    assert len(done) > per_worker, f"only {len(done)} commits interleaved"
    print(f"{where}: {len(done)} commits from {3 * per_worker} operations, {sum(retries)} optimistic reruns")
    if where == "s3":  # the optimistic path really ran: commits found the branch moved and reran
        assert sum(retries) > 0, "no S3 commit ever conflicted: the interleaving did not exercise the retry"
    # every commit, in branch order: a regen changes no input; a record or import holds what it wrote
    first = order.index(initial.snapshot)  # the first record: every case is there from here on
    previous = {case: _input_digests(store.reader(order[first]), case, "replicated") for case in CASES}
    for snap in order[first + 1:]:
        reader = store.reader(snap)
        now = {case: _input_digests(reader, case, "replicated") for case in CASES}
        kind, case, want = ops.get(snap, (None, None, None))
        for other in CASES:
            if other != case:
                assert now[other] == previous[other], f"{snap} ({kind} {case}) changed the inputs of {other}"
        if kind == "regen":
            assert now[case] == previous[case], f"{snap}: a regen wrote other inputs than the head it regenerated"
        elif kind is not None:
            assert now[case] == _wanted(tmp_path, exports, case, *want), f"{snap}: {kind} {want} did not land"
        previous = now
    head = store.reader()
    for case in CASES:
        tree = trees.load_tree(head, case, "replicated")
        fresh = tree.case.reference(dict(tree.inputs), "replicated")
        for name, value in tree.expected.items():
            assert torch.equal(value.view(-1).view(torch.uint8), fresh[name].contiguous().view(-1).view(torch.uint8)), \
                f"{case}: expected output {name} is not the reference's on the stored inputs"


def _wanted(tmp_path, exports, case: str, kind: str, seed: int) -> dict[str, str]:
    if kind == "import":
        return exports[(case, seed)][1]
    rec, inputs, _outputs = trees.build_tree(trees.get_case(case), "replicated", seed)
    return {f"{case}/replicated/in/{name}": digest(to_numpy(t)[0]) for name, t in inputs.items()}
