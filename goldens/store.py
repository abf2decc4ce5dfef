"""The storage layer: an icechunk repository (Zarr v3) per store root. Knows keys, bytes, attributes and
snapshots only -- not cases, operators or comparators.

Every commit runs under an exclusive file lock (icechunk on a local filesystem can silently lose
concurrent commits); reads use read-only sessions and take no lock, so readers (pytest-xdist workers)
never block or corrupt writers. Only arrays whose bytes changed are rewritten.

Spec: §7.3 (save/replay), §7.2 (per-wiring trees).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import hashlib
import mmap
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import google_crc32c
import icechunk
import numcodecs
import numpy as np
import zarr
import zarr.codecs
import zarr.errors
import zarr.storage

from goldens.errors import GoldenStoreError
from kernels import workers

# Commits are serialized by our own file lock, so icechunk's local-filesystem concurrency warning is noise.
if not os.environ.get("ICECHUNK_LOG"):
    with contextlib.suppress(Exception):
        icechunk.set_logs_filter("error")

LOCK_NAME = "pto-store.lock"
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14
READ_CACHE_DIR = ".read-cache"  # decoded arrays by content digest, memory-mapped on later reads (not versioned)
REPO_DIR = "icechunk"  # the repository lives beside the lock file: icechunk needs a clean prefix
CHUNK_BYTES = 8 * 2**20  # target bytes per chunk along the first dimension (see benchmarks/store.py)
CACHE_MIN_BYTES = 1 << 16  # smaller arrays read faster from the store than from a file of their own
COMPRESS_BELOW = 0.85  # compress an array only if a 1 MB sample shrinks below this ratio


def damaged(root: object, exc: BaseException) -> str:
    """One line for a repository icechunk cannot read: the store, the first line of the cause, what to do."""
    first = next((ln.strip(" x|`") for ln in str(exc).splitlines() if ln.strip(" x|`")), type(exc).__name__)
    return (f"golden store {root} is damaged or unreadable: {first[:300]} (restore the store directory from "
            "version control or a backup)")


def digest(arr: np.ndarray) -> str:
    """Content hash of an array's bytes (plus dtype and shape), used to skip unchanged writes."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{arr.dtype.str}{arr.shape}".encode())
    h.update(np.ascontiguousarray(arr).view(np.uint8).reshape(-1).data)
    return h.hexdigest()


def checksum(arr: np.ndarray) -> int:
    """CRC32C of the array bytes (hardware-accelerated, ~10 GB/s), verified on every read."""
    return int(google_crc32c.value(np.ascontiguousarray(arr).view(np.uint8).reshape(-1)))


def _codecs(arr: np.ndarray) -> list:
    """Blosc LZ4 with a bit shuffle where it pays (a 1 MB sample compresses below 0.85), else raw bytes:
    incompressible payloads (random FP32, FP8/FP4 codes) read fastest uncompressed. Chosen with
    benchmarks/store.py; zstd and a per-chunk CRC32C codec read slower. Corruption is caught by the
    whole-array CRC32C checked on read and by the decompressor."""
    blosc = zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle", typesize=arr.dtype.itemsize)
    flat = np.ascontiguousarray(arr).reshape(-1)
    sample = flat[: max(1, (1 << 20) // max(arr.dtype.itemsize, 1))]
    if sample.nbytes == 0:
        return []
    ratio = len(numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.BITSHUFFLE,
                                typesize=arr.dtype.itemsize).encode(sample)) / sample.nbytes
    return [blosc] if ratio < COMPRESS_BELOW else []


def _chunks(arr: np.ndarray) -> tuple[int, ...]:
    if arr.ndim == 0:
        return ()
    row = max(1, arr.nbytes // max(arr.shape[0], 1))
    first = max(1, min(arr.shape[0], CHUNK_BYTES // row))
    return (first, *arr.shape[1:])


@dataclass(frozen=True)
class CommitResult:
    snapshot: str | None  # None when nothing changed (no commit was made)
    written: tuple[str, ...]
    unchanged: tuple[str, ...]


@dataclass(frozen=True)
class LogEntry:
    snapshot: str
    written_at: dt.datetime
    message: str
    metadata: dict
    tags: tuple[str, ...]


class Transaction:
    """What a locked read-modify-write sees and stages (``GoldenStore.transaction``)."""

    def __init__(self, session, root: zarr.Group):
        self.session, self.root = session, root
        self.reader = StoreReader(root, "(head, locked)")
        self.written: list[str] = []
        self.unchanged: list[str] = []
        self.staged: list[tuple[np.ndarray, dict]] = []  # (array, attrs with digest) written by this commit
        self.result: CommitResult | None = None

    def write(self, arrays: dict[str, tuple[np.ndarray, dict]], group_attrs: dict[str, dict], *,
              remove: tuple[str, ...] = ()) -> None:
        root = self.root
        for path in remove:
            if path in root:
                del root[path]
                self.written.append(f"-{path}")
        for path, attrs in group_attrs.items():
            group = root.require_group(path)
            if dict(group.attrs) != attrs:
                group.attrs.clear()
                group.attrs.update(attrs)
                self.written.append(f"{path}/@attrs")
        for path, (arr, attrs) in arrays.items():
            full = {**attrs, "digest": digest(arr), "crc32c": checksum(arr)}
            existing = root.get(path)
            if isinstance(existing, zarr.Array) and existing.shape == arr.shape and \
                    existing.dtype == arr.dtype and dict(existing.attrs) == full:
                self.unchanged.append(path)
                continue
            parent, _, name = path.rpartition("/")
            group = root.require_group(parent) if parent else root
            out = group.create_array(name, shape=arr.shape, dtype=arr.dtype, chunks=_chunks(arr),
                                     compressors=_codecs(arr), overwrite=True, attributes=full,
                                     fill_value=0 if arr.dtype != bool else False)
            if arr.ndim == 0:
                out[()] = arr
            elif arr.size:
                out[...] = arr
            self.written.append(path)
            self.staged.append((arr, full))


class GoldenStore:
    """An icechunk repository at ``root`` (created on first write)."""

    def __init__(self, root: str | os.PathLike, *, read_cache: str | os.PathLike | None = None):
        self.root = Path(root)
        env = os.environ.get("PTO_STORE_READ_CACHE")
        if read_cache is None and env is not None:
            read_cache = env or None  # PTO_STORE_READ_CACHE="" turns the cache off
        elif read_cache is None:
            read_cache = self.root / READ_CACHE_DIR
        self.read_cache = None if read_cache is None else Path(read_cache)

    # ---- repository ---------------------------------------------------------
    def exists(self) -> bool:
        return (self.root / REPO_DIR / "repo").exists() or (self.root / REPO_DIR / "refs").exists()

    def _repo(self, *, create: bool = False) -> icechunk.Repository:
        storage = icechunk.local_filesystem_storage(str((self.root / REPO_DIR).resolve()))
        try:
            if create:
                return icechunk.Repository.open_or_create(storage)
            if not self.exists():
                raise GoldenStoreError(f"no golden store at {self.root} (record a case first: goldens record ...)")
            return icechunk.Repository.open(storage)
        except GoldenStoreError:
            raise
        except Exception as exc:
            raise GoldenStoreError(damaged(self.root, exc)) from exc

    @contextlib.contextmanager
    def lock(self, *, timeout: float | None = None) -> Iterator[None]:
        """Exclusive inter-process lock for every read-modify-write (released by the kernel even on SIGKILL).

        The holder writes its pid and command into the lock file; a writer that has to wait says once, on
        stderr, whom it waits for, and gives up after ``timeout`` seconds (default ``PTO_STORE_LOCK_TIMEOUT``,
        else 600) with a GoldenStoreError (exit 2)."""
        if timeout is None:
            timeout = float(os.environ.get("PTO_STORE_LOCK_TIMEOUT", "600"))
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fh = open(self.root / LOCK_NAME, "a+")  # noqa: SIM115 (held across the yield)
        except OSError as exc:
            raise GoldenStoreError(f"cannot lock golden store {self.root}: {exc.strerror or exc} "
                                   "(is the path a directory you can write?)") from None
        with fh:
            deadline, told = time.monotonic() + timeout, False
            while True:
                try:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not told:
                        fh.seek(0)
                        holder = fh.read().strip() or "another process"
                        print(f"goldens: waiting for the store lock of {self.root} held by {holder} "
                              f"(gives up after {timeout:g} s; PTO_STORE_LOCK_TIMEOUT)", file=sys.stderr)
                        told = True
                    if time.monotonic() >= deadline:
                        raise GoldenStoreError(f"golden store {self.root} is locked by {holder}; gave up after "
                                               f"{timeout:g} s (raise PTO_STORE_LOCK_TIMEOUT or stop that writer)"
                                               ) from None
                    time.sleep(0.05)
            try:
                fh.seek(0)
                fh.truncate()
                fh.write(f"pid {os.getpid()} ({' '.join(sys.argv[:3])[:120]}) since "
                         f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M:%S} UTC\n")
                fh.flush()
                yield
            finally:
                with contextlib.suppress(OSError):
                    fh.seek(0)
                    fh.truncate()
                    fh.flush()
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    @contextlib.contextmanager
    def transaction(self, message: str, *, metadata: dict | None = None, tag: str | None = None
                    ) -> Iterator[Transaction]:
        """A read-modify-write under the lock: ``txn.reader`` reads the branch head *as of the lock* (the base
        every change is computed from), ``txn.write(...)`` stages arrays and attributes, and leaving the block
        commits once (with ``tag`` in the same locked step). Tags a crash left behind are restored first."""
        with self.lock():
            repo = self._repo(create=True)
            self._restore_tags(repo)
            session = repo.writable_session("main")
            txn = Transaction(session, zarr.open_group(session.store, mode="a"))
            yield txn
            if not txn.written:
                txn.result = CommitResult(None, (), tuple(txn.unchanged))
                return
            if os.environ.get("PTO_STORE_TEST_PAUSE_BEFORE_COMMIT"):  # reliability tests kill us here
                time.sleep(float(os.environ["PTO_STORE_TEST_PAUSE_BEFORE_COMMIT"]))
            meta = {**(metadata or {}), **({"tag": tag} if tag else {})}
            snapshot = session.commit(message, metadata=meta)
            if os.environ.get("PTO_STORE_TEST_PAUSE_BEFORE_TAG"):  # reliability tests kill us here
                time.sleep(float(os.environ["PTO_STORE_TEST_PAUSE_BEFORE_TAG"]))
            if tag:
                repo.create_tag(tag, snapshot)
            txn.result = CommitResult(snapshot, tuple(txn.written), tuple(txn.unchanged))
            if self.read_cache is not None:  # the first read in a fresh process then maps them too
                cache = StoreReader(None, snapshot, cache=self.read_cache)
                for arr, attrs in txn.staged:
                    cache.store_in_cache(arr, attrs)

    @staticmethod
    def _restore_tags(repo: icechunk.Repository) -> None:
        """A writer killed between its commit and its tag left the tag name in the snapshot's metadata:
        create the missing tags (so gc keeps those snapshots)."""
        have = set(repo.list_tags())
        for snap in repo.ancestry(branch="main"):
            name = (snap.metadata or {}).get("tag")
            if name and name not in have:
                repo.create_tag(name, snap.id)
                have.add(name)

    # ---- writing ------------------------------------------------------------
    def commit(self, arrays: dict[str, tuple[np.ndarray, dict]], group_attrs: dict[str, dict], message: str, *,
               metadata: dict | None = None, tag: str | None = None, remove: tuple[str, ...] = ()) -> CommitResult:
        """Write ``arrays`` (path -> (array, attrs)) and group attributes in one commit under the lock.

        An array whose dtype, shape, content hash and attributes equal the stored one is not rewritten;
        when nothing changes no commit is made. ``remove`` deletes groups/arrays first.
        """
        with self.transaction(message, metadata=metadata, tag=tag) as txn:
            txn.write(arrays, group_attrs, remove=remove)
        return txn.result

    # ---- reading ------------------------------------------------------------
    def resolve(self, rev: str | None) -> dict:
        """A revision: None/"main" (branch head), a tag name, or a snapshot id."""
        if rev in (None, "main"):
            return {"branch": "main"}
        repo = self._repo()
        if rev in set(repo.list_tags()):
            return {"tag": rev}
        try:
            repo.readonly_session(snapshot_id=rev)
        except Exception:
            raise GoldenStoreError(f"unknown revision {rev!r}: not 'main', a tag ({sorted(repo.list_tags())}) "
                                   "or a snapshot id (see goldens log)") from None
        return {"snapshot_id": rev}

    def reader(self, rev: str | None = None) -> StoreReader:
        repo = self._repo()
        try:
            session = repo.readonly_session(**self.resolve(rev))
        except GoldenStoreError:
            raise
        except Exception as exc:
            raise GoldenStoreError(f"cannot open revision {rev or 'main'} of {self.root}: {exc}") from exc
        try:
            root = zarr.open_group(session.store, mode="r")
        except zarr.errors.GroupNotFoundError:
            ancestry = list(repo.ancestry(snapshot_id=session.snapshot_id))  # raises on a damaged snapshot
            if len(ancestry) != 1:
                raise GoldenStoreError(f"snapshot {session.snapshot_id} of {self.root} has no root group: the "
                                       "store is damaged (restore it from version control)") from None
            root = None  # the repository's first snapshot holds nothing yet
        return StoreReader(root, session.snapshot_id, cache=self.read_cache)

    def log(self) -> list[LogEntry]:
        """The branch history, newest first, then every tagged snapshot gc has taken off that history (a tag
        keeps its snapshot, and the log keeps showing it)."""
        repo = self._repo()
        tags: dict[str, list[str]] = {}
        for name in repo.list_tags():
            tags.setdefault(repo.lookup_tag(name), []).append(name)
        entries = [LogEntry(s.id, s.written_at, s.message, dict(s.metadata or {}), tuple(sorted(tags.get(s.id, []))))
                   for s in repo.ancestry(branch="main")]
        seen = {e.snapshot for e in entries}
        for snap_id, names in sorted(tags.items()):
            if snap_id not in seen:
                s = next(iter(repo.ancestry(snapshot_id=snap_id)))
                entries.append(LogEntry(s.id, s.written_at, s.message, dict(s.metadata or {}), tuple(sorted(names))))
        return entries

    def tag(self, name: str, snapshot: str) -> None:
        with self.lock():
            self._repo().create_tag(name, snapshot)

    def gc(self, older_than: dt.datetime) -> tuple[int, object]:
        """Expire snapshots older than ``older_than`` (tags and the branch head are kept), then delete
        unreachable objects. Refuses, changing nothing, when a tag cannot be read (its snapshot would lose the
        tag's protection). Returns (expired count, GC summary)."""
        with self.lock():
            repo = self._repo()
            self._restore_tags(repo)
            on_disk = {p.name.removeprefix("tag.") for p in (self.root / REPO_DIR / "refs").glob("tag.*")}
            for name in sorted(set(repo.list_tags()) | on_disk):  # list_tags leaves out a tag it cannot read
                try:
                    next(iter(repo.ancestry(tag=name)))
                except Exception as exc:
                    raise GoldenStoreError(f"gc refused: tag {name!r} of {self.root} cannot be read "
                                           f"({damaged(self.root, exc).split(': ', 1)[1]}); nothing was expired"
                                           ) from None
            expired = repo.expire_snapshots(older_than, delete_expired_branches=False, delete_expired_tags=False)
            summary = repo.garbage_collect(older_than)
            return len(expired), summary

    def disk_bytes(self) -> int:
        """Bytes of the versioned store (the read cache is a disposable copy and does not count)."""
        return sum(p.stat().st_size for p in self.root.rglob("*")
                   if p.is_file() and READ_CACHE_DIR not in p.relative_to(self.root).parts)


def _map_npy(f: Path) -> np.ndarray:
    """A private (copy-on-write, so writable) mapping of an .npy file's data whose page-cache pages the kernel
    maps in one go for reading (MADV_POPULATE_READ), rather than one fault per page as the checksum walks it."""
    with open(f, "rb") as fh:
        version = np.lib.format.read_magic(fh)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in read_header:
            raise ValueError(f"{f}: .npy version {version}")
        shape, fortran, dtype = read_header[version](fh)
        offset = fh.tell()
        if fortran or dtype.hasobject:
            raise ValueError(f"{f}: not a C-order plain array")
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            return np.empty(shape, dtype)
        mm = mmap.mmap(fh.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        with contextlib.suppress(OSError, ValueError):  # kernels before 5.14 lack it: pages then fault one by one
            mm.madvise(MADV_POPULATE_READ)
    return np.frombuffer(mm, dtype=dtype, count=count, offset=offset).reshape(shape)


def _verified(path: str, data, node: zarr.Array) -> tuple[np.ndarray, dict]:
    """(array, attrs) after checking the array's recorded CRC32C."""
    data = np.asarray(data)
    attrs = dict(node.attrs)
    want = attrs.get("crc32c")
    if want is not None and checksum(data) != want:
        raise GoldenStoreError(f"array {path!r}: CRC32C mismatch (stored {want}); the store is corrupted")
    return data, attrs


class StoreReader:
    """Read-only view of one snapshot (``root`` None: an empty snapshot, e.g. the repository's first)."""

    def __init__(self, root: zarr.Group | None, snapshot: str, *, cache: Path | None = None):
        self.root = root if root is not None else zarr.open_group(zarr.storage.MemoryStore(), mode="w")
        self.snapshot = snapshot
        self.cache = cache

    def _cache_file(self, attrs: dict) -> Path | None:
        d = attrs.get("digest")
        return None if self.cache is None or not isinstance(d, str) else self.cache / d[:2] / f"{d}.npy"

    def _from_cache(self, path: str, node: zarr.Array) -> np.ndarray | None:
        """The array from the read cache when a verified copy is there: same dtype and shape as the stored
        array and the stored CRC32C (a damaged or foreign cache file is dropped and the store is read)."""
        attrs = dict(node.attrs)
        f = self._cache_file(attrs)
        if f is None or not f.is_file() or f.is_symlink():
            return None
        try:
            data = _map_npy(f)
        except (OSError, ValueError):
            data = None
        if data is None or data.dtype != node.dtype or data.shape != node.shape or \
                checksum(data) != attrs.get("crc32c"):
            with contextlib.suppress(OSError):
                f.unlink()
            return None
        return data

    def _to_cache(self, node: zarr.Array, data: np.ndarray) -> None:
        self.store_in_cache(data, dict(node.attrs))

    def store_in_cache(self, data: np.ndarray, attrs: dict) -> None:
        f = self._cache_file(attrs)
        if f is None or data.nbytes < CACHE_MIN_BYTES:
            return
        with contextlib.suppress(OSError):  # best effort: a read-only or full disk only loses the speed-up
            f.parent.mkdir(parents=True, exist_ok=True)
            tmp = f.with_name(f".{f.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            with open(tmp, "wb") as fh:
                np.save(fh, np.ascontiguousarray(data), allow_pickle=False)
            os.replace(tmp, f)

    def has(self, path: str) -> bool:
        return path in self.root

    def group_attrs(self, path: str) -> dict:
        node = self.root.get(path)
        if not isinstance(node, zarr.Group):
            raise GoldenStoreError(f"no group {path!r} in snapshot {self.snapshot}")
        return dict(node.attrs)

    def arrays(self, path: str) -> list[str]:
        node = self.root.get(path)
        if not isinstance(node, zarr.Group):
            return []
        return sorted(name for name, _ in node.arrays())

    def groups(self, path: str = "") -> list[str]:
        node = self.root if not path else self.root.get(path)
        if not isinstance(node, zarr.Group):
            return []
        return sorted(name for name, _ in node.groups())

    def array_attrs(self, path: str) -> dict:
        node = self.root.get(path)
        if not isinstance(node, zarr.Array):
            raise GoldenStoreError(f"missing array {path!r} in snapshot {self.snapshot}")
        return dict(node.attrs)

    def read(self, path: str) -> tuple[np.ndarray, dict]:
        """(array, attrs); a missing array, or a chunk that fails its checksum or decompression, raises
        GoldenStoreError naming the array."""
        node = self.root.get(path)
        if not isinstance(node, zarr.Array):
            raise GoldenStoreError(f"missing array {path!r} in snapshot {self.snapshot}")
        try:
            data = node[()] if node.ndim == 0 else node[...]
        except Exception as exc:
            raise GoldenStoreError(f"array {path!r}: cannot read its chunks ({type(exc).__name__}: {exc}); "
                                   "the store may be corrupted or truncated") from exc
        return _verified(path, data, node)

    def read_many(self, paths: list[str]) -> dict[str, tuple[np.ndarray, dict]]:
        """Read several arrays: each from the verified read cache when it is there (memory-mapped, CRC32C
        checked, concurrently), the others in one gather on zarr's event loop (I/O and decompression of
        different arrays overlap) and then cached; same checks as ``read``. A failing array is re-read
        alone so the error names it."""
        nodes = {}
        for path in paths:
            node = self.root.get(path)
            if not isinstance(node, zarr.Array):
                raise GoldenStoreError(f"missing array {path!r} in snapshot {self.snapshot}")
            nodes[path] = node
        cached = dict(zip(nodes, workers.pool().map(lambda item: self._from_cache(*item), nodes.items()),
                          strict=True)) if self.cache is not None else dict.fromkeys(nodes)
        out = {p: (cached[p], dict(n.attrs)) for p, n in nodes.items() if cached[p] is not None}
        missing = {p: n for p, n in nodes.items() if cached[p] is None}
        if not missing:
            return out
        try:
            from zarr.core.sync import sync

            async def gather():
                return await asyncio.gather(*(n._async_array.getitem(() if n.ndim == 0 else ...)
                                              for n in missing.values()))

            datas = sync(gather())
        except Exception:
            datas = None
        for i, (path, node) in enumerate(missing.items()):
            data, attrs = self.read(path) if datas is None else _verified(path, datas[i], node)  # names a failure
            out[path] = (data, attrs)
            self._to_cache(node, data)
        return out

    def walk_arrays(self, path: str = "") -> list[str]:
        """Every array path below ``path``."""
        out = []
        node = self.root if not path else self.root.get(path)
        if not isinstance(node, zarr.Group):
            return out
        for name, child in node.members():
            full = f"{path}/{name}" if path else name
            if isinstance(child, zarr.Array):
                out.append(full)
            else:
                out.extend(self.walk_arrays(full))
        return sorted(out)
