"""The store's write path: chunks written straight to icechunk read back through zarr byte for byte (several
chunks, a padded last one, compressed or raw, every dtype kind), and a store of BLAKE2b digests moves to BLAKE3
on its first write without losing, misreporting or laundering anything. Spec: §7.3."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import zarr

import goldens.store_format as gf
import goldens.store_write as gs
from goldens import trees
from goldens.catalog import record_checksum
from goldens.errors import GoldenStoreError
from goldens.store import GoldenStore
from goldens.store_format import current_digest


def _old_digest(arr: np.ndarray) -> str:
    """The digest stores were written with before BLAKE3 (BLAKE2b-128, no prefix)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{arr.dtype.str}{arr.shape}".encode())
    h.update(np.ascontiguousarray(arr).view(np.uint8).reshape(-1).data)
    return h.hexdigest()


ARRAYS = {
    "bf16-like rows": np.arange(1000 * 37, dtype=np.uint16).reshape(1000, 37),  # compresses: Blosc
    "random fp32": np.random.default_rng(0).standard_normal((333, 5)).astype(np.float32),  # raw bytes
    "int32 3-d": np.random.default_rng(1).integers(-5, 5, (41, 3, 2), dtype=np.int32),
    "bool": np.random.default_rng(2).integers(0, 2, (77,)).astype(bool),
    "0-d": np.array(3.5, dtype=np.float32),
    "empty": np.zeros((0, 4), dtype=np.uint8),
}


@pytest.mark.parametrize("setter", ["icechunk", "zarr"])
@pytest.mark.parametrize("name", list(ARRAYS))
def test_direct_chunk_writes_read_back_through_zarr_byte_for_byte(tmp_path, monkeypatch, name, setter):
    """Through icechunk's own ``set`` (the buffer as it is) and through zarr's ``Store.set`` (a copy)."""
    monkeypatch.setattr(gs, "CHUNK_BYTES", 1000)  # several chunks, the last one partial
    if setter == "zarr":
        monkeypatch.setattr(gs, "_bytes_setter", lambda store: None)
    arr = ARRAYS[name]
    store = GoldenStore(tmp_path / "s")
    store.commit({"t/a": (arr, {"dtype": str(arr.dtype)})}, {"t": {}}, "write")
    store.read_cache = None
    got, attrs = store.reader().read("t/a")
    assert got.dtype == arr.dtype and got.shape == arr.shape
    assert got.tobytes() == arr.tobytes(), f"{name}: bytes differ after a round trip"
    assert current_digest(attrs["digest"])
    node = zarr.open_group(store.reader().root.store, mode="r")[attrs["pool"]]
    if arr.ndim and arr.size:
        assert node.nchunks > 1 or arr.shape[0] * arr[0].nbytes <= 1000, f"{name}: one chunk only, nothing tested"
        assert np.array_equal(node[...], arr), f"{name}: zarr reads another array"


def test_chunks_reach_icechunk_without_zarrs_copy(tmp_path):
    """The write path finds icechunk's own ``set`` under the session's store (an icechunk upgrade that moves it
    fails here, instead of every write silently taking zarr's copy of each chunk), and it takes a buffer."""
    import icechunk

    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "r")))
    session = repo.writable_session("main")
    setter = gs._bytes_setter(session.store)
    assert setter is not None, "icechunk's own set is not found: chunks go through zarr's copy"
    assert gs._bytes_setter(zarr.storage.MemoryStore()) is None


def test_one_commit_writes_each_content_once_and_reports_in_order(tmp_path, monkeypatch):
    """The arrays of a commit are hashed, looked up and written concurrently: two arrays of one content in the
    same commit write its chunks once, a content the store already holds writes none, an unchanged array is
    reported unchanged, a changed one rewritten, and ``written`` keeps the caller's order."""
    monkeypatch.setattr(gs, "CHUNK_BYTES", 1000)
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal((150, 4)).astype(np.float32) for _ in range(3))  # 3 chunks each
    store = GoldenStore(tmp_path / "s")
    store.commit({"t/kept": (a, {}), "t/moved": (b, {})}, {"t": {}}, "first")
    puts: list[str] = []
    real = gs._bytes_setter

    def counting(st):
        inner = real(st)

        async def put(key, data):
            puts.append(key.rsplit("/c/", 1)[0])
            return await inner(key, data)

        return put

    monkeypatch.setattr(gs, "_bytes_setter", counting)
    # the two arrays of content c finish hashing together, so both look for it before either has written it
    import threading
    from concurrent.futures import ThreadPoolExecutor

    pool, together, real_sums = ThreadPoolExecutor(5), threading.Barrier(2, timeout=30), gs._sums

    def sums(arr):
        out = real_sums(arr)
        if arr.tobytes() == c.tobytes() and arr is not c:
            together.wait()
        return out

    monkeypatch.setattr(gs.workers, "pool", lambda: pool)
    monkeypatch.setattr(gs, "_sums", sums)
    new = {"u/x": (c.copy(), {}), "t/kept": (a, {}), "u/y": (c.copy(), {}), "u/z": (b.copy(), {}), "t/moved": (c, {})}
    result = store.commit(new, {"u": {"case": "u"}}, "second")
    assert result.written == ("u/@attrs", "u/x", "u/y", "u/z", "t/moved"), result.written
    assert result.unchanged == ("t/kept",), result.unchanged
    assert puts and set(puts) == {gf.pool_path(gf.digest(c))}, f"chunk writes of {sorted(set(puts))}"
    assert len(puts) == 3, f"{len(puts)} chunk writes for one content of 3 chunks"
    store.read_cache = None
    reader = store.reader()
    for path, (arr, _attrs) in new.items():
        assert reader.read(path)[0].tobytes() == arr.tobytes(), path


def _opened(doc: bytes):
    """The metadata zarr reads from the node document ``doc``."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    store = zarr.storage.MemoryStore()
    sync(store.set("a/zarr.json", default_buffer_prototype().buffer.from_bytes(doc)))
    return zarr.open_array(store, path="a", mode="r").metadata


def _zarr_metadata(arr: np.ndarray, codecs: list, attrs: dict):
    """The metadata ``zarr.create_array`` gives ``arr`` stored as the store stores it."""
    return zarr.create_array(zarr.storage.MemoryStore(), name="a", shape=arr.shape, dtype=arr.dtype,
                             chunks=gs._chunks(arr), compressors=codecs, fill_value=gs._fill_value(arr),
                             attributes=attrs).metadata


@pytest.mark.parametrize("compressed", [False, True], ids=["raw", "blosc"])
@pytest.mark.parametrize("name", list(ARRAYS))
def test_a_node_document_written_directly_is_the_one_zarr_writes(name, compressed):
    """The ``zarr.json`` a write puts straight into the store (``_document``) opens, through zarr, as the very
    metadata ``zarr.create_array`` gives the same array: shape, chunk grid, dtype, fill value, codecs, chunk
    key encoding and attributes."""
    arr = ARRAYS[name]
    codecs = [gs._blosc(arr.dtype.itemsize)[0]] if compressed else []
    attrs = {"dtype": "bfloat16", "shape": list(arr.shape), "digest": "b3-00", "crc32c": 7, "nested": {"a": [1]}}
    gs._templates([arr])
    doc = gs._document(arr, codecs, attrs)
    assert doc is not None, f"{name}: written through zarr, the direct path is not exercised"
    mine, theirs = _opened(doc), _zarr_metadata(arr, codecs, attrs)
    assert mine == theirs, (mine, theirs)


def test_a_node_document_of_another_kind_is_told_apart():
    """The comparison above can fail: a document made from another dtype's template opens as other metadata."""
    arr, other = ARRAYS["int32 3-d"], ARRAYS["int32 3-d"].astype(np.int64)
    gs._templates([arr, other])
    doc = json.loads(gs._document(other, [], {}))
    doc["shape"] = list(arr.shape)
    assert _opened(json.dumps(doc).encode()) != _zarr_metadata(arr, [], {})


def test_a_direct_chunk_write_that_differs_from_zarr_is_caught_on_read(tmp_path, monkeypatch):
    """Seeded defect: the last chunk written unpadded (zarr stores edge chunks at the full chunk shape)."""
    monkeypatch.setattr(gs, "CHUNK_BYTES", 1000)
    real = gs._chunk_pieces

    def unpadded(out, arr):
        pieces = real(out, arr)
        if pieces:
            key, raw, codec = pieces[-1]
            pieces[-1] = (key, raw[: (arr.shape[0] % out.chunks[0] or out.chunks[0]) * arr[0].nbytes], codec)
        return pieces

    monkeypatch.setattr(gs, "_chunk_pieces", unpadded)
    store = GoldenStore(tmp_path / "s")
    arr = ARRAYS["random fp32"]
    store.commit({"t/a": (arr, {})}, {"t": {}}, "write")
    store.read_cache = None
    try:
        got, _ = store.reader().read("t/a")
    except Exception as exc:  # zarr's decode error, or our CRC32C: either way the read is refused
        assert "t/a" in str(exc) or "chunk" in str(exc).lower() or "CRC32C" in str(exc), exc
        return
    assert got.tobytes() == arr.tobytes(), "unreachable"  # a silent wrong read would fail here
    pytest.fail("an unpadded last chunk was read back as the right bytes: the seeded defect went unseen")


def _legacy_store(path, monkeypatch, tamper: str = "") -> GoldenStore:
    """A store as written before BLAKE3: BLAKE2b digests everywhere, no root 'digest' attribute."""
    with monkeypatch.context() as m:
        m.setattr(gs, "digest", _old_digest)
        m.setattr(trees, "digest", _old_digest)
        m.setattr(gs.Transaction, "sweep", lambda self: ([], 0))
        store = GoldenStore(path)
        trees.record(store, [("rope_rows", "replicated"), ("compressor_r2", "replicated")], seed=1)
        if tamper:  # a forger's edit of a record, its checksum left as it was
            bad = {**store.reader().group_attrs(tamper), "seed": 7}
            store.update(lambda txn: txn.root[tamper].attrs.update(bad) or txn.written.append(tamper), "tamper")
    return store


def test_a_blake2b_store_moves_to_blake3_on_its_first_write_and_loses_nothing(tmp_path, monkeypatch):
    store = _legacy_store(tmp_path / "s", monkeypatch, tamper="compressor_r2/replicated")
    reader = store.reader()
    assert "digest" not in dict(reader.root.attrs)
    assert not any(current_digest(reader.array_attrs(p)["digest"]) for p in reader.walk_arrays())
    before = {p: reader.read(p)[0].tobytes() for p in reader.walk_arrays()}

    trees.record(store, [("sp_slabs", "replicated")], seed=1)  # the first write after the change of digest

    reader = store.reader()
    assert dict(reader.root.attrs).get("digest") == "blake3"
    paths = reader.walk_arrays()
    assert all(current_digest(reader.array_attrs(p)["digest"]) for p in paths)
    assert {p: reader.read(p)[0].tobytes() for p in before} == before, "a byte moved in the migration"
    pool = reader.root.get(gf.POOL)
    assert all(name.startswith(gf.DIGEST_PREFIX) for name, _ in pool.arrays()), "old contents left in the pool"
    rec = trees.load_tree(reader, "rope_rows", "replicated")  # record resealed, digests renamed
    assert all(current_digest(d) for d in rec.record.arrays.values())
    after = reader.group_attrs("compressor_r2/replicated")
    assert after["checksum"] != record_checksum(after), "the tampered record was resealed by the migration"
    with pytest.raises(GoldenStoreError):
        trees.load_tree(reader, "compressor_r2", "replicated")


def test_an_unchanged_record_after_the_move_writes_nothing(tmp_path, monkeypatch):
    store = _legacy_store(tmp_path / "s", monkeypatch)
    first = trees.record(store, [("rope_rows", "replicated")], seed=1)  # the tree itself is unchanged
    assert first.snapshot is None and not first.written, "the move of digests was reported as the record's"
    log = store.log()
    assert "moved to BLAKE3" in log[0].message and log[0].metadata.get("action") == "digest-move"
    sums = json.loads((store.root / gf.SUMS_NAME).read_text())
    on_disk = {p.name for p in (store.root / gf.REPO_DIR / "snapshots").iterdir() if p.is_file()}
    assert set(sums) == on_disk, "the move's snapshot file has no recorded sha256"
    again = trees.record(store, [("rope_rows", "replicated")], seed=1)
    assert again.snapshot is None and not again.written and len(store.log()) == len(log)
