"""Store reliability: corrupted or truncated chunks are named, a writer killed mid-commit loses nothing
already stored, concurrent recorders lose no commit. Spec: §7.3."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from goldens import trees
from goldens.catalog import record_checksum
from goldens.errors import GoldenStoreError
from goldens.store import GoldenStore
from goldens.store_format import REPO_DIR
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]


def _record(store: GoldenStore, *items):
    return trees.record(store, list(items), seed=1)


def _chunk_files(store: GoldenStore) -> list[Path]:
    return sorted(p for p in (store.root / REPO_DIR / "chunks").rglob("*") if p.is_file())


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_chunk_gives_an_error_naming_the_array(tmp_path, damage):
    store = GoldenStore(tmp_path / "s")
    _record(store, ("compressor_r2", "replicated"))
    files = _chunk_files(store)
    assert files, "no chunk files written"
    for f in files:
        data = bytearray(f.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0xFF
            f.write_bytes(bytes(data))
        else:
            f.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(GoldenStoreError, match=r"array 'compressor_r2/replicated/(in|out)/\w+'"):
        trees.load_tree(store.reader(), "compressor_r2", "replicated")


def _writer(store_root: Path, case: str, pause: float | None = None):
    """A ``goldens record`` process (a child of the test fork server: ``subprocess.Popen``'s interface)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if pause is not None:
        env["PTO_STORE_TEST_PAUSE_BEFORE_COMMIT"] = str(pause)
    return forkserver.popen([sys.executable, "-m", "goldens.cli", "--store", str(store_root), "record", case,
                             "--seed", "9"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_writer_killed_mid_commit_leaves_the_previous_version_intact(tmp_path):
    store = GoldenStore(tmp_path / "s")
    _record(store, ("rope_rows", "replicated"))
    head = store.log()[0].snapshot
    before = {p: store.reader().array_attrs(p)["digest"] for p in store.reader().walk_arrays()}
    proc = _writer(store.root, "compressor_r2", pause=60)
    deadline = time.time() + 60
    chunks_before = len(_chunk_files(store))
    while time.time() < deadline and len(_chunk_files(store)) == chunks_before:
        time.sleep(0.2)  # wait until the writer has written chunks and sits before the commit
    assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert store.log()[0].snapshot == head, "a killed writer moved the branch"
    reader = store.reader()
    assert {p: reader.array_attrs(p)["digest"] for p in reader.walk_arrays()} == before
    assert not reader.has("compressor_r2/replicated")
    tree = trees.load_tree(reader, "rope_rows", "replicated")  # every byte still readable and verified
    assert tree.inputs and tree.expected
    result = _record(store, ("compressor_r2", "replicated"))  # the lock was released by the kernel
    assert result.snapshot is not None


def test_four_concurrent_recorders_lose_no_commit(tmp_path):
    store = GoldenStore(tmp_path / "s")
    _record(store, ("rope_rows", "replicated"))
    cases = ["cache_window", "cache_index", "indexer_topk", "sp_slabs"]
    procs = [_writer(store.root, c) for c in cases]
    for p in procs:
        out, errs = p.communicate(timeout=300)
        assert p.returncode == 0, errs.decode()[-2000:]
    log = store.log()
    messages = [e.message for e in log]
    for c in cases:
        assert sum(m.startswith(f"record {c}/") for m in messages) == 1, messages
        assert trees.recorded_wirings(store.reader(), c), f"{c} lost"
    assert len(log) == 2 + len(cases)  # init + first record + one commit per recorder


def test_a_blocked_writer_names_the_holder_and_gives_up_with_exit_2(tmp_path):
    """A writer that finds the store locked says once whom it waits for, and after PTO_STORE_LOCK_TIMEOUT
    seconds gives up with exit 2 and one line naming the store; nothing is written."""
    store = GoldenStore(tmp_path / "s")
    _record(store, ("rope_rows", "replicated"))
    head = store.log()[0].snapshot
    with store.lock():
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PTO_STORE_LOCK_TIMEOUT": "1"}
        proc = forkserver.run([sys.executable, "-m", "goldens.cli", "--store", str(store.root), "record",
                               "sp_slabs"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-1000:]
    assert f"waiting for the store lock of {store.root} held by pid {os.getpid()}" in proc.stderr, proc.stderr
    assert "gave up after 1 s" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert store.log()[0].snapshot == head


def test_a_regen_killed_between_its_commit_and_its_tag_gets_its_tag_back(tmp_path):
    """The regen tag is recorded in the commit's metadata: a writer killed after the commit and before the
    tag leaves a snapshot whose tag the next write restores (so gc keeps it)."""
    store = GoldenStore(tmp_path / "s")
    _record(store, ("rope_rows", "replicated"))
    reader = store.reader()
    path = "rope_rows/replicated"
    attrs = reader.group_attrs(path)
    stale = {**attrs, "fingerprint": "sha256:stale"}
    store.commit({}, {path: {**stale, "checksum": record_checksum(stale)}}, "make the tree stale")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PTO_STORE_TEST_PAUSE_BEFORE_TAG": "60"}
    proc = forkserver.popen([sys.executable, "-m", "goldens.cli", "--store", str(store.root), "regen", "rope_rows"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and not store.log()[0].message.startswith("regen"):
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    entry = store.log()[0]
    assert entry.message.startswith("regen") and not entry.tags, entry
    _record(store, ("sp_slabs", "replicated"))  # the next write restores the tag
    regen = next(e for e in store.log() if e.snapshot == entry.snapshot)
    assert regen.tags == (entry.metadata["tag"],), regen


def test_a_write_checks_the_tags_of_the_snapshots_since_the_last_check_only(tmp_path, monkeypatch):
    """Each commit records the head its tag check started from; the next write reads the snapshots back to
    there, not the whole history -- and still restores a tag lost in that span (a writer killed after its
    commit: the test above), here the newest commit's, whose tag could not be written."""
    import icechunk

    store = GoldenStore(tmp_path / "s")
    for seed in range(8):
        trees.record(store, [("rope_rows", "replicated")], seed=seed)
    with monkeypatch.context() as m:  # the tag cannot be written: the commit lands without it
        m.setattr(GoldenStore, "_create_tag", staticmethod(lambda *a: (_ for _ in ()).throw(OSError("no tag"))))
        assert store.commit({}, {"marker": {"n": 1}}, "tagged", tag="regen-20260101T000000000000Z").tag_error
    assert not store.log()[0].tags
    seen = []
    real = icechunk.Repository.ancestry

    def counted(self, *args, **kwargs):
        for snap in real(self, *args, **kwargs):
            seen.append(snap.id)
            yield snap

    monkeypatch.setattr(icechunk.Repository, "ancestry", counted)
    trees.record(store, [("rope_rows", "replicated")], seed=99)
    assert 2 <= len(seen) <= 3, f"the tag check read {len(seen)} of {len(store.log())} snapshots"
    assert "regen-20260101T000000000000Z" in store.log()[1].tags, "the lost tag was not restored"


def _mapped(arr) -> bool:
    import mmap

    while arr is not None and not isinstance(arr, mmap.mmap):
        arr = arr.obj if isinstance(arr, memoryview) else getattr(arr, "base", None)
    return arr is not None


def _pack_store(tmp_path):
    import numpy as np

    store = GoldenStore(tmp_path / "s", read_cache=tmp_path / "cache")
    arrays = {"t/big": (np.arange(1 << 15, dtype=np.float32).reshape(128, 256), {"dtype": "float32"}),
              "t/small": (np.arange(12, dtype=np.int32).reshape(3, 4), {"dtype": "int32"}),
              "t/scalar": (np.array(7, dtype=np.int64), {"dtype": "int64"}),
              "t/empty": (np.zeros((0, 3), dtype=np.uint16), {"dtype": "bfloat16"})}
    store.commit(arrays, {"t": {}}, "four arrays")
    return store, arrays


def test_a_read_already_answered_comes_from_its_pack_without_a_store_lookup(tmp_path, monkeypatch):
    """The second read of the same paths at the same snapshot is one pack file: no chunk decoded (the store's
    raw chunk bytes are fetched only to confirm their fingerprint, #48); the same dtypes, shapes (0-d and empty
    included), bytes and attributes, writable arrays; the large array comes from the content cache. Spec: §7.3."""
    import numpy as np

    from goldens.store_read import StoreReader

    store, arrays = _pack_store(tmp_path)
    paths = list(arrays)
    first = store.reader().read_many(paths)
    packs = list(store.packs.rglob("*.pack"))
    assert len(packs) == 1

    def no_store(*_a, **_k):
        raise AssertionError("the store was read")

    monkeypatch.setattr(StoreReader, "_read_many", no_store)
    again = store.reader().read_many(paths)
    for p, (want, _attrs) in arrays.items():
        got, attrs = again[p]
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), p
        assert attrs == first[p][1] and attrs["dtype"] == arrays[p][1]["dtype"], p
    again["t/small"][0][0, 0] = -1  # writable, and the pack keeps its bytes
    assert np.array_equal(store.reader().read_many(paths)["t/small"][0], arrays["t/small"][0])
    with pytest.raises(AssertionError, match="the store was read"):
        store.reader().read_many(paths[:2])  # other paths: another read, not this pack's


def test_a_damaged_or_foreign_pack_is_dropped_and_the_store_read(tmp_path):
    """A pack with a flipped byte, a pack moved under another read's name, and a pack whose small array was
    changed and its hash made to match again (the array's CRC32C refuses it): each read answers from the store
    with the stored bytes and the pack is written afresh. Spec: §7.3."""
    import blake3
    import numpy as np

    from goldens import readpack

    store, arrays = _pack_store(tmp_path)
    paths = list(arrays)
    store.reader().read_many(paths)
    (pack,) = store.packs.rglob("*.pack")
    good = pack.read_bytes()

    def check():
        got = store.reader().read_many(paths)
        assert all(np.array_equal(got[p][0], a) for p, (a, _) in arrays.items())
        assert pack.read_bytes() == good, "the pack was not rewritten from the store"

    flipped = bytearray(good)
    flipped[-3] ^= 0xFF
    pack.write_bytes(bytes(flipped))
    check()
    other = readpack.pack_file(store.packs, store.reader().snapshot, store.reader().pack_keys(paths[:2]))
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_bytes(good)  # this read's pack under another read's name: its header names other paths
    got = store.reader().read_many(paths[:2])
    assert np.array_equal(got["t/small"][0], arrays["t/small"][0]) and other.read_bytes() != good
    resealed = bytearray(good)
    at = good.index(arrays["t/small"][0].tobytes())
    resealed[at] ^= 0x01  # another value in the small array's bytes ...
    body = bytes(resealed[len(readpack.MAGIC) + 32:])
    resealed[len(readpack.MAGIC): len(readpack.MAGIC) + 32] = blake3.blake3(body).digest()  # ... hash matched
    pack.write_bytes(bytes(resealed))
    assert readpack.load(pack, store.reader().snapshot, store.reader().pack_keys(paths)) is not None  # it checks out
    check()  # the CRC32C refused the array


def test_the_packs_of_the_newest_snapshots_are_kept(tmp_path):
    """Each snapshot read gets its own pack folder; past ``KEEP_SNAPSHOTS`` the oldest folders are deleted (a
    regen a day would otherwise grow the cache without end), and a read whose pack was deleted reads the store."""
    import numpy as np

    from goldens import readpack

    store = GoldenStore(tmp_path / "s")
    snapshots = []
    for n in range(readpack.KEEP_SNAPSHOTS + 2):
        store.commit({"t/x": (np.arange(n + 1, dtype=np.int32), {"dtype": "int32"})}, {"t": {}}, f"{n}")
        reader = store.reader()
        assert reader.read_many(["t/x"])["t/x"][0].tolist() == list(range(n + 1))
        snapshots.append(reader.snapshot)
    folders = sorted(p.name for p in store.packs.iterdir())
    assert folders == sorted(snapshots[-readpack.KEEP_SNAPSHOTS:]), (folders, snapshots)
    assert store.reader(snapshots[0]).read_many(["t/x"])["t/x"][0].tolist() == [0]  # its pack was deleted


def test_the_read_cache_is_outside_the_store_and_each_store_keeps_its_own_packs(tmp_path, monkeypatch):
    """A store's directory holds only what version control keeps: its read cache is in the user cache
    directory. Two stores sharing that cache keep their packs apart (one store's snapshots do not push the
    other's out), and the pack folder of a store no pack was written to for ``KEEP_STORE_DAYS`` goes when a new
    store's comes (a read answered from a pack writes none; a read that writes one keeps the folder)."""
    import numpy as np

    from goldens import readpack

    monkeypatch.delenv("PTO_STORE_READ_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    first, second = GoldenStore(tmp_path / "a"), GoldenStore(tmp_path / "b")
    assert first.read_cache == second.read_cache == tmp_path / "home-cache" / "pto-contracts" / "read-cache"
    big = np.arange(40_000, dtype=np.float32)
    first.commit({"t/x": (big, {"dtype": "float32"})}, {"t": {}}, "a")
    assert np.array_equal(first.reader().read_many(["t/x"])["t/x"][0], big)
    assert np.array_equal(first.reader().read_many(["t/x"])["t/x"][0], big)
    assert not [p for p in first.root.rglob("*") if p.name not in {"pto-store.lock", "pto-snapshot-sums.json"}
                and "icechunk" not in p.relative_to(first.root).parts], "the store directory holds a cache"
    assert list(first.read_cache.rglob("*.npy")) and list(first.packs.rglob("*.pack"))
    for n in range(readpack.KEEP_SNAPSHOTS + 1):
        second.commit({"t/x": (np.arange(n + 1, dtype=np.int32), {"dtype": "int32"})}, {"t": {}}, f"{n}")
        second.reader().read_many(["t/x"])
    assert first.packs != second.packs and len(list(first.packs.iterdir())) == 1
    old = time.time() - (readpack.KEEP_STORE_DAYS + 1) * 86400
    for idle in (first, second):
        os.utime(idle.packs, (old, old))
    first.reader().read_many(["t/x"])  # answered before, from its pack: nothing written, still idle
    second.reader().read_many([])  # another read (other paths: none), so a pack written: the folder is in use
    third = GoldenStore(tmp_path / "c")
    third.commit({"t/x": (np.arange(3, dtype=np.int32), {"dtype": "int32"})}, {"t": {}}, "c")
    third.reader().read_many(["t/x"])
    assert not first.packs.exists() and second.packs.is_dir() and third.packs.is_dir()


def test_reads_share_a_repository_until_the_snapshot_files_move(tmp_path):
    """Readers of one store share one opened repository (its snapshots parsed once) while the snapshot files
    are those it was opened on; after a commit, a gc that rewrites a kept snapshot's parent, or the store made
    again at the same path, a reader opens it afresh and reads the new head and history."""
    import datetime as dt
    import shutil

    import numpy as np

    from goldens import store as store_mod

    def x(n):
        return {"t/x": (np.arange(n, dtype=np.int32), {"dtype": "int32"})}

    store = GoldenStore(tmp_path / "s")
    for n in (2, 3, 4):
        store.commit(x(n), {"t": {}}, f"{n}")
    first = store.reader()
    shared = store_mod._REPOS.copy()
    assert GoldenStore(store.root).reader().read_many(["t/x"])["t/x"][0].tolist() == [0, 1, 2, 3]
    assert shared == store_mod._REPOS and len(shared) == 1  # the same repository, reused
    store.commit(x(5), {"t": {}}, "5")
    assert GoldenStore(store.root).reader().read_many(["t/x"])["t/x"][0].tolist() == [0, 1, 2, 3, 4]
    assert shared != store_mod._REPOS
    assert first.read_many(["t/x"])["t/x"][0].tolist() == [0, 1, 2, 3]  # an open reader keeps its snapshot
    store.gc(dt.datetime.now(dt.UTC) + dt.timedelta(days=1), keep_last=2)
    reader = GoldenStore(store.root).reader()
    assert reader.read_many(["t/x"])["t/x"][0].tolist() == [0, 1, 2, 3, 4]
    history = [e.message for e in GoldenStore(store.root).log()]
    assert history[0].startswith("gc:") and history[1] == "5" and "2" not in history, history  # expired
    shutil.rmtree(store.root)
    again = GoldenStore(tmp_path / "s")
    again.commit(x(3), {"t": {}}, "made again")
    assert again.reader().read_many(["t/x"])["t/x"][0].tolist() == [0, 1, 2]
    assert [e.message for e in again.log()][:1] == ["made again"]


def test_the_read_cache_is_verified_and_disposable(tmp_path, monkeypatch):
    """Arrays read once are kept, by content digest, in a memory-mappable read cache; a later read takes them
    from there only after the stored CRC32C checks out: a damaged, resized or foreign cache file is dropped
    and the store is read instead. PTO_STORE_READ_CACHE="" turns the cache off. Spec: §7.3."""
    import numpy as np

    store = GoldenStore(tmp_path / "s", read_cache=tmp_path / "cache")  # this test's own: it counts the files
    big = np.arange(1 << 16, dtype=np.float32).reshape(256, 256)
    store.commit({"t/x": (big, {"dtype": "float32"})}, {"t": {}}, "big")
    first, _ = store.reader().read_many(["t/x"])["t/x"]
    cached = list(store.read_cache.rglob("*.npy"))
    assert len(cached) == 1 and np.array_equal(first, big)
    again, _ = store.reader().read_many(["t/x"])["t/x"]
    assert _mapped(again) and np.array_equal(again, big)
    again[0, 0] = -1.0  # a private mapping: writable, and the cache file keeps its bytes
    assert np.array_equal(store.reader().read_many(["t/x"])["t/x"][0], big)
    np.save(cached[0], big + 1)  # same shape and dtype, other bytes: the CRC32C refuses it
    third, _ = store.reader().read_many(["t/x"])["t/x"]
    assert not _mapped(third) and np.array_equal(third, big)
    np.save(cached[0], big[:10])  # another shape
    assert np.array_equal(store.reader().read_many(["t/x"])["t/x"][0], big)
    stored = store.disk_bytes()
    legacy = store.root / ".read-cache" / "ab" / "old.npy"  # left inside a store by a version before 2026-12-03
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(b"x" * 1000)
    assert store.disk_bytes() == stored  # a disposable copy, not stored bytes
    monkeypatch.setenv("PTO_STORE_READ_CACHE", "")
    off = GoldenStore(tmp_path / "s")
    assert off.read_cache is None and np.array_equal(off.reader().read_many(["t/x"])["t/x"][0], big)


def test_a_read_cache_miss_fetches_each_chunk_once(tmp_path):
    """#48: the chunk check fetched every raw chunk to fingerprint it, and a miss then fetched the same chunks again
    to decode them; a miss now decodes the bytes the check fetched (each chunk key got once), and reads the same
    arrays as a store without a read cache."""
    import collections

    import icechunk
    import numpy as np

    store = GoldenStore(tmp_path / "s", read_cache=tmp_path / "cache")
    trees.record(store, [("v4_prefill_indexer", "replicated")], seed=5)
    calls = collections.Counter()
    original = icechunk.IcechunkStore.get

    async def counting(self, key, prototype, byte_range=None):
        if "/c/" in key or key.endswith("/c"):
            calls[key] += 1
        return await original(self, key, prototype, byte_range)

    reader = store.reader()
    paths = reader.walk_arrays("v4_prefill_indexer/replicated")
    icechunk.IcechunkStore.get = counting
    try:
        got = reader.read_many(paths)
    finally:
        icechunk.IcechunkStore.get = original
    assert calls and max(calls.values()) == 1, calls.most_common(3)
    plain = GoldenStore(tmp_path / "s", read_cache=None).reader().read_many(paths)
    assert all(np.array_equal(got[p][0], plain[p][0]) and got[p][0].dtype == plain[p][0].dtype for p in paths)
