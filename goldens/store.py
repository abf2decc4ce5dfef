"""The storage layer: an icechunk repository (Zarr v3) per store root -- a local directory or an S3 prefix
(``s3://bucket/prefix``). Knows keys, bytes, attributes and snapshots only -- not cases, operators or
comparators.

Every read-modify-write reads its base and commits in one step that cannot lose another writer's commit:
on a local directory under an exclusive file lock (icechunk on a local filesystem can silently lose
concurrent commits); on S3 as an optimistic transaction -- S3's conditional writes make icechunk refuse a
commit whose branch moved since its base was read, and the whole read-modify-write is then rerun on the new
head. Reads use read-only sessions and take no lock, so readers (pytest-xdist workers) never block or
corrupt writers. Only arrays whose bytes changed are rewritten.

Spec: §7.3 (save/replay), §7.2 (per-wiring trees).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import functools
import hashlib
import json
import math
import mmap
import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import blake3
import crc32c
import icechunk
import numcodecs
import numpy as np
import zarr
import zarr.codecs
import zarr.errors
import zarr.storage
from zarr.core.buffer import default_buffer_prototype
from zarr.core.metadata.v3 import ArrayV3Metadata
from zarr.storage import StorePath

from goldens import readpack
from goldens.catalog import record_checksum
from goldens.errors import GoldenStoreError
from kernels import workers

# Commits are serialized by our own file lock, so icechunk's local-filesystem concurrency warning is noise.
if not os.environ.get("ICECHUNK_LOG"):
    with contextlib.suppress(Exception):
        icechunk.set_logs_filter("off")  # every error reaches us as an exception, said in one line

LOCK_NAME = "pto-store.lock"
# sha256 of every snapshot file of a local store, written under the lock after each write: icechunk's snapshot
# files carry no checksum, so a flipped byte would otherwise be parsed (a wrong history, a wrong manifest offset)
SUMS_NAME = "pto-snapshot-sums.json"
TAGS_CHECKED = "tags_checked"  # commit metadata: the head whose ancestry's tags were checked before it
MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux 5.14
READ_CACHE_DIR = ".read-cache"  # where versions before 2026-12-03 kept the read cache, inside the store (not counted)
REPO_DIR = "icechunk"  # the repository lives beside the lock file: icechunk needs a clean prefix
REGEN_TAG_PREFIX = "regen-"  # the tags goldens regen makes (gc --keep-regen-tags may delete the oldest)
CHUNK_BYTES = 8 * 2**20  # target bytes per chunk along the first dimension (see benchmarks/store.py)
CACHE_MIN_BYTES = 1 << 16  # smaller arrays read faster from the store than from a file of their own
COMPRESS_BELOW = 0.85  # compress an array only if a 1 MB sample shrinks below this ratio
# Each distinct array content is stored once, at pool/<digest>; the array a tree names is a link: same shape,
# dtype and attributes, no chunks of its own, and attribute "pool" naming its content. The inputs a case's two
# wirings share, and those of a tree recorded from upstream beside its own, are then stored once. gc sweeps
# contents no link names.
POOL = "pool"
DIGEST_PREFIX = "b3-"  # digests of array contents (``digest``); the store's root attribute "digest" says "blake3"
S3_COMMIT_ATTEMPTS = 50  # an optimistic commit on S3 reruns its read-modify-write this often before giving up


@dataclass(frozen=True)
class Location:
    """Where a store lives: a local directory, or a bucket and prefix on S3 (``s3://bucket/prefix``).

    S3 settings come from the usual AWS environment: credentials (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, or a profile / instance role), ``AWS_REGION`` (or
    ``AWS_DEFAULT_REGION``), and ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` for an S3-compatible server
    (MinIO, Ceph, a local test server), which is then addressed path-style (http allowed)."""

    url: str
    path: Path | None = None
    bucket: str | None = None
    prefix: str | None = None

    @property
    def remote(self) -> bool:
        return self.bucket is not None

    @classmethod
    def parse(cls, spec: str | os.PathLike) -> Location:
        text = os.fspath(spec)
        if "://" not in text:
            return cls(text, path=Path(text))
        scheme, _, rest = text.partition("://")
        if scheme != "s3":
            raise GoldenStoreError(f"store {text!r}: unsupported scheme {scheme}:// (a local directory or "
                                   "s3://bucket/prefix)")
        bucket, _, prefix = rest.partition("/")
        prefix = prefix.strip("/")
        if not bucket or not prefix:
            raise GoldenStoreError(f"store {text!r}: give a bucket and a prefix, e.g. s3://my-bucket/goldens/v41 "
                                   "(a prefix keeps the repository apart from anything else in the bucket)")
        return cls(f"s3://{bucket}/{prefix}", bucket=bucket, prefix=prefix)

    def storage(self) -> icechunk.Storage:
        if not self.remote:
            return icechunk.local_filesystem_storage(str((self.path / REPO_DIR).resolve()))
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
        return icechunk.s3_storage(bucket=self.bucket, prefix=f"{self.prefix}/{REPO_DIR}", region=region,
                                   endpoint_url=endpoint, allow_http=bool(endpoint and endpoint.startswith("http:")),
                                   force_path_style=bool(endpoint), from_env=True)

    def __str__(self) -> str:
        return self.url


def default_read_cache() -> Path:
    """Every store's cache is in the user cache directory, outside the store (a store is what version control
    holds; the cache is a disposable local copy): entries are keyed by content digest and verified on every
    read, so stores share them, and each store keeps its own packs (``goldens.readpack``)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "pto-contracts" / "read-cache"


def _already_exists(exc: BaseException) -> bool:
    return "already exists" in str(exc)


def damaged(root: object, exc: BaseException) -> str:
    """One line for a repository icechunk cannot read: the store, the first line of the cause, what to do."""
    return (f"golden store {root} is damaged or unreadable: {condensed(exc)[:300]} (restore the store directory from "
            "version control or a backup)")


def condensed(exc: BaseException) -> str:
    """An icechunk error (a multi-line trace) as one line: the innermost cause, and the object it concerns."""
    text = str(exc)
    where = re.search(r"(manifest_id|snapshot_id|chunk_id)=(\w+)", text)
    cause = innermost(exc)
    return f"{cause} ({where[1].removesuffix('_id')} {where[2]})" if where else cause


def innermost(exc: BaseException) -> str:
    """The innermost cause of an icechunk error (its last ``->`` line; an S3 error as ``Code: message``), else
    its first line."""
    lines = [ln.strip() for ln in str(exc).splitlines()]
    causes = [ln.split("->", 1)[1].strip() for ln in lines if ln.startswith(("|->", "`->"))]
    cause = causes[-1] if causes else next((ln.strip(" x|`") for ln in lines if ln.strip(" x|`")),
                                           type(exc).__name__)
    found = re.search(r'code: "([^"]+)", message: "([^"]*)"', cause)
    return f"{found[1]}: {found[2]}" if found else cause[:300]


def unreachable(location: Location, exc: BaseException) -> str:
    """One line for an S3 store that cannot be opened: the store, the innermost cause (e.g. ``NoSuchBucket:
    The specified bucket does not exist``, ``Connection refused``), the endpoint, and what to check."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS default"
    return (f"golden store {location} cannot be opened: {innermost(exc)} (endpoint {endpoint}; check the bucket, "
            "AWS_ENDPOINT_URL, AWS_REGION and the credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or "
            "AWS_PROFILE)")


def write_failed(root: object, exc: BaseException) -> str:
    """One line for a commit the storage refused (a full disk, a read-only file system, an S3 error)."""
    return (f"cannot write golden store {root}: {innermost(exc)}; nothing was committed and the stored snapshots "
            "are unchanged (free space or fix the storage, then run the command again)")


def digest(arr: np.ndarray) -> str:
    """Content address of an array's bytes (plus dtype and shape): ``b3-`` and 128 bits of BLAKE3, which hashes
    ~3 GB/s on one core here, against ~0.6 GB/s for the BLAKE2b of stores written before (their digests have no
    prefix; the first write to such a store moves it to BLAKE3, ``Transaction.sweep``)."""
    h = blake3.blake3(f"{arr.dtype.str}{arr.shape}".encode())
    h.update(np.ascontiguousarray(arr).view(np.uint8).reshape(-1).data)
    return DIGEST_PREFIX + h.hexdigest(length=16)


def current_digest(d: object) -> bool:
    """``d`` is a digest of the current kind (BLAKE3)."""
    return isinstance(d, str) and d.startswith(DIGEST_PREFIX)


def checksum(arr: np.ndarray) -> int:
    """CRC32C of the array bytes, verified on every read: hardware-accelerated (~13 GB/s here) and computed
    with the GIL released, so the read path checks several arrays on several cores at once."""
    return int(crc32c.crc32c(np.ascontiguousarray(arr).view(np.uint8).reshape(-1)))


@functools.cache
def _blosc(typesize: int) -> tuple[zarr.codecs.BloscCodec, numcodecs.Blosc]:
    """The one Blosc setting of the store (LZ4, level 5, bit shuffle), as zarr's codec (the array metadata) and
    as numcodecs' (the sample probe and the direct chunk writes), built from the same values."""
    zarr_codec = zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle", typesize=typesize, blocksize=0)
    return zarr_codec, numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.BITSHUFFLE,
                                       typesize=typesize, blocksize=0)


def _codecs(arr: np.ndarray) -> list:
    """Blosc LZ4 with a bit shuffle where it pays (a 1 MB sample compresses below 0.85), else raw bytes:
    incompressible payloads (random FP32, FP8/FP4 codes) read fastest uncompressed. Chosen with
    benchmarks/store.py; zstd and a per-chunk CRC32C codec read slower. Corruption is caught by the
    whole-array CRC32C checked on read and by the decompressor."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    sample = flat[: max(1, (1 << 20) // max(arr.dtype.itemsize, 1))]
    if sample.nbytes == 0:
        return []
    zarr_codec, probe = _blosc(arr.dtype.itemsize)
    return [zarr_codec] if len(probe.encode(sample)) / sample.nbytes < COMPRESS_BELOW else []


def _chunks(arr: np.ndarray) -> tuple[int, ...]:
    if arr.ndim == 0:
        return ()
    row = max(1, arr.nbytes // max(arr.shape[0], 1))
    first = max(1, min(arr.shape[0], CHUNK_BYTES // row))
    return (first, *arr.shape[1:])


# The local repositories reads opened in this process, reused: a new Repository parses each snapshot it reads
# anew (12 ms for the sample store's), a reused one keeps them (a snapshot never changes; every session still
# reads its branch head from the storage, and the snapshot files are checked before each open as always).
_REPOS: dict[str, icechunk.Repository] = {}
_REPOS_LOCK = threading.Lock()


_TEMPLATES: dict[tuple[str, int, bool], dict] = {}


def _templates(arrays) -> None:
    """zarr's own ``zarr.json`` document of an array of each dtype and rank in ``arrays``, raw and with
    ``_blosc``'s codec, made once by ``zarr.create_array`` in memory (outside zarr's event loop: call before
    ``_stage``); ``_document`` fills in a shape, chunk shape and attributes."""
    for dtype, ndim in {(a.dtype.str, a.ndim) for a in arrays}:
        for compressed in (False, True):
            if (dtype, ndim, compressed) in _TEMPLATES:
                continue
            dt = np.dtype(dtype)
            made = zarr.create_array(zarr.storage.MemoryStore(), shape=(1,) * ndim, dtype=dt, chunks=(1,) * ndim,
                                     compressors=[_blosc(dt.itemsize)[0]] if compressed else (),
                                     fill_value=_fill_value(np.empty(0, dt)))
            _TEMPLATES[dtype, ndim, compressed] = json.loads(
                made.metadata.to_buffer_dict(default_buffer_prototype())["zarr.json"].to_bytes())


def _document(arr: np.ndarray, compressors: list, attrs: dict) -> bytes | None:
    """The ``zarr.json`` of a new array node holding ``arr`` (chunked by ``_chunks``, ``compressors`` from
    ``_codecs``), as ``zarr.create_array`` writes it; None where zarr must make it (a big-endian dtype, or
    attributes JSON cannot spell). Writing it straight to the store skips zarr's per-array dtype parsing,
    existence checks and parent-group writes (recording every case, 73 trees and 2,366 nodes: 16.5 s -> 2.4 s
    of staging)."""
    template = _TEMPLATES.get((arr.dtype.str, arr.ndim, bool(compressors)))
    if template is None or arr.dtype.byteorder == ">" or \
            (compressors and tuple(compressors) != (_blosc(arr.dtype.itemsize)[0],)):
        return None
    doc = {**template, "shape": list(arr.shape),
           "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(_chunks(arr))}},
           "attributes": attrs}
    try:
        return json.dumps(doc, allow_nan=False).encode()
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class CommitResult:
    snapshot: str | None  # None when nothing changed (no commit was made)
    written: tuple[str, ...]
    unchanged: tuple[str, ...]
    tag_error: str = ""  # the commit landed but its tag could not be written (restored by the next write)


@dataclass(frozen=True)
class LogEntry:
    snapshot: str
    written_at: dt.datetime
    message: str
    metadata: dict
    tags: tuple[str, ...]


def _chunk_pieces(out: zarr.Array, arr: np.ndarray) -> list[tuple[str, np.ndarray, object]] | None:
    """(store key, raw bytes, Blosc codec or None) of every chunk of ``out``, cut from ``arr``'s own memory; None where zarr's own pipeline must write it (a 0-d or big-endian array, a codec other than ``_blosc``'s).

    The bytes are what zarr's codec pipeline would store -- the raw C-order bytes of each chunk (zarr's bytes
    codec, little-endian), the last chunk padded to the full chunk shape with the fill value (0), or those bytes
    through the same Blosc codec -- so zarr reads them back; the whole-array CRC32C checked on every read
    vouches for it. Writing them straight to the store skips zarr's per-chunk copies and event-loop hops
    (benchmarks/store.py: 1.1 s -> 0.25 s for a 225 MB tree)."""
    if arr.ndim == 0 or arr.size == 0 or arr.dtype.byteorder == ">" or not arr.flags.c_contiguous:
        return None
    compressors = out.compressors
    blosc = None
    if compressors:
        zarr_codec, blosc = _blosc(arr.dtype.itemsize)
        if tuple(compressors) != (zarr_codec,):  # not the store's own setting: zarr's pipeline writes it
            return None
    rows = out.chunks[0]
    flat = arr.view(np.uint8).reshape(arr.shape[0], -1)
    pieces = []
    for i, start in enumerate(range(0, arr.shape[0], rows)):
        part = flat[start:start + rows]
        if part.shape[0] < rows:  # zarr stores edge chunks at the full chunk shape
            padded = np.zeros((rows, flat.shape[1]), np.uint8)
            padded[: part.shape[0]] = part
            part = padded
        key = f"{out.path}/{out.metadata.encode_chunk_key((i, *([0] * (arr.ndim - 1))))}"
        pieces.append((key, part.reshape(-1), blosc))
    return pieces


def _fill_value(arr: np.ndarray):
    return False if arr.dtype == bool else 0


async def _all(*aws) -> list:
    """``asyncio.gather`` that waits for every awaitable and then raises the first failure: none is left running
    or unretrieved (a full disk fails many chunk writes at once, and asyncio would print each one)."""
    out = await asyncio.gather(*aws, return_exceptions=True)
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return out


def _bytes_setter(store) -> Callable | None:
    """icechunk's own ``set(key, bytes-like)`` under an ``IcechunkStore``, or None. zarr's ``Buffer.to_bytes``
    (what ``IcechunkStore.set`` passes on) copies every chunk into a new ``bytes`` while holding the GIL; icechunk
    takes any buffer itself (benchmarks/store.py: 243 MB of chunks 0.091 s -> 0.055 s). The chunk's memory is
    not touched until the write is awaited."""
    inner = getattr(store, "_store", None) if isinstance(store, icechunk.IcechunkStore) else None
    setter = getattr(inner, "set", None)
    return setter if callable(setter) else None


def _zarr_setter(store) -> Callable:
    """``set(key, bytes-like)`` through zarr's ``Store.set`` (a copy into a ``Buffer``): where ``_bytes_setter``
    finds none."""
    prototype = default_buffer_prototype()

    async def put(key: str, data) -> None:
        await store.set(key, prototype.buffer.from_bytes(data))

    return put


async def _fill(out: zarr.AsyncArray, arr: np.ndarray, put_bytes: Callable) -> None:
    """Write the chunks of one new content with ``put_bytes`` (``_chunk_pieces``; Blosc encodes on the worker
    pool, with the GIL released, and each chunk is written as soon as it is encoded), else through zarr's own
    pipeline."""
    pieces = _chunk_pieces(zarr.Array(out), arr)
    if pieces is None:
        await out.setitem(() if arr.ndim == 0 else ..., arr)
        return
    loop, pool = asyncio.get_running_loop(), workers.pool()

    async def put(key: str, raw: np.ndarray, codec) -> None:
        data = raw if codec is None else await loop.run_in_executor(pool, codec.encode, raw)
        await put_bytes(key, memoryview(data))

    await _all(*(put(*piece) for piece in pieces))


def _sums(arr: np.ndarray) -> tuple[str, int]:
    """What a write needs to know of every array's bytes, computed off the event loop: digest and CRC32C."""
    return digest(arr), checksum(arr)


class Transaction:
    """What a locked read-modify-write sees and stages (``GoldenStore.update``)."""

    def __init__(self, session, root: zarr.Group):
        self.session, self.root = session, root
        self.reader = StoreReader(root, "(head, locked)")
        self.written: list[str] = []
        self.unchanged: list[str] = []
        self.result: CommitResult | None = None

    def write(self, arrays: dict[str, tuple[np.ndarray, dict]], group_attrs: dict[str, dict], *,
              remove: tuple[str, ...] = ()) -> None:
        root = self.root
        for path in remove:
            if path == POOL or path.startswith(POOL + "/"):
                raise GoldenStoreError(f"{path}: the content pool is not removed by name (goldens gc sweeps it)")
            if path in root:
                del root[path]
                self.written.append(f"-{path}")
        for path, attrs in group_attrs.items():
            group = root.require_group(path)
            if dict(group.attrs) != attrs:
                group.attrs.put(attrs)  # one metadata write (clear() + update() writes once per key)
                self.written.append(f"{path}/@attrs")
        if arrays:
            from zarr.core.sync import sync

            _templates(a for a, _attrs in arrays.values())
            for path, kept in zip(arrays, sync(self._stage(arrays)), strict=True):
                (self.unchanged if kept else self.written).append(path)

    async def _stage(self, arrays: dict[str, tuple[np.ndarray, dict]]) -> list[bool]:
        """Write every array, all at once on zarr's event loop, each as soon as its own bytes are hashed: the
        digests and CRC32Cs (BLAKE3 and CRC32C release the GIL) run on the worker pool while the chunks of the
        arrays already hashed are encoded and written (benchmarks/store.py). Per array: one lookup of the link,
        one of its content, the link's document and, for a content the store lacks, its document and chunks.
        Returns, per array, whether it was unchanged."""
        root = self.root._async_group
        loop, pool = asyncio.get_running_loop(), workers.pool()
        hashed = [loop.run_in_executor(pool, _sums, arr) for arr, _attrs in arrays.values()]  # queued first

        # (no listing of groups here: icechunk's list_dir inside this gather can deadlock zarr's event loop)
        groups = {p: (await root.require_group(p) if p else root)
                  for p in sorted({path.rpartition("/")[0] for path in arrays})}
        content_group = await root.require_group(POOL)
        store = root.store_path.store
        put_bytes = _bytes_setter(store) or _zarr_setter(store)
        claimed: set[str] = set()  # contents one of this commit's arrays writes (two arrays, one content)

        async def exists(path: str) -> bool:
            return await store.exists(f"{path}/zarr.json")

        async def create(group, path: str, arr: np.ndarray, compressors: list, attrs: dict, replace: bool):
            """A new node straight from its document (``_document``), else (replacing a node, an array zarr
            must describe) through zarr; returns the node as zarr reads it back."""
            doc = None if replace else _document(arr, compressors, attrs)
            if doc is None:
                return await group.create_array(path.rpartition("/")[2], shape=arr.shape, dtype=arr.dtype,
                                                chunks=_chunks(arr), compressors=compressors, overwrite=True,
                                                attributes=attrs, fill_value=_fill_value(arr))
            await store.set(f"{path}/zarr.json", default_buffer_prototype().buffer.from_bytes(doc))
            return zarr.AsyncArray(metadata=ArrayV3Metadata.from_dict(json.loads(doc)), store_path=StorePath(store, path))

        async def one(path: str, arr: np.ndarray, attrs: dict, sums) -> bool:
            there = await exists(path)
            existing = (await root.getitem(path)) if there else None  # (a node is opened only where there is one)
            d, crc = await sums
            full = {**attrs, "digest": d, "crc32c": crc, "pool": pool_path(d)}
            if isinstance(existing, zarr.AsyncArray) and existing.shape == arr.shape and \
                    existing.dtype == arr.dtype and dict(existing.attrs) == full:
                return True
            parent, _, name = path.rpartition("/")
            group = groups[parent]
            link = create(group, f"{group.path}/{name}".lstrip("/"), arr, [], full, existing is not None)
            w = full["pool"]
            if w in claimed:
                await link
                return False
            claimed.add(w)

            async def content() -> None:
                if await exists(w):
                    return
                compressors = await loop.run_in_executor(pool, _codecs, arr)  # (a new content's only: a probe)
                node = await create(content_group, w, arr, compressors, {"digest": d, "crc32c": crc}, False)
                if arr.ndim == 0 or arr.size:
                    await _fill(node, arr, put_bytes)

            await _all(link, content())
            return False

        return await _all(*(one(path, arr, attrs, sums)
                            for (path, (arr, attrs)), sums in zip(arrays.items(), hashed, strict=True)))

    def sweep(self) -> tuple[list[str], int]:
        """Rewrite every array stored the old way (its own chunks, or a digest of the BLAKE2b kind) as a link to
        its content under its BLAKE3 digest, rename the digests the tree records list to match, and delete the
        contents no link names: (the paths rewritten, the contents deleted)."""
        reader = self.reader
        linked, legacy = set(), []
        for path in reader.walk_arrays():
            attrs = reader.array_attrs(path)
            if attrs.get("pool") and current_digest(attrs.get("digest")):
                linked.add(attrs["pool"])
            else:
                legacy.append(path)
        renamed = {}
        for path in legacy:
            data, attrs = reader.read(path)
            self.write({path: (data, {k: v for k, v in attrs.items() if k not in ("digest", "crc32c", "pool")})}, {})
            renamed[attrs.get("digest")] = d = digest(data)
            linked.add(pool_path(d))
        if renamed:  # a record names its arrays' digests (goldens.trees checks them on load)
            for path, node in self.root.members(max_depth=None):
                listed = node.attrs.get("arrays") if isinstance(node, zarr.Group) else None
                if isinstance(listed, dict) and any(v in renamed for v in listed.values()):
                    before = dict(node.attrs)
                    after = {**before, "arrays": {k: renamed.get(v, v) for k, v in listed.items()}}
                    if "checksum" in before and before["checksum"] == record_checksum(before):
                        after["checksum"] = record_checksum(after)  # resealed only if it was sound: never launders
                    node.attrs.put(after)
                    self.written.append(f"{path}/@attrs")
        pool = self.root.get(POOL)
        dead = [] if not isinstance(pool, zarr.Group) else \
            [f"{POOL}/{name}" for name, _ in pool.arrays() if f"{POOL}/{name}" not in linked]
        for where in dead:
            del self.root[where]
            self.written.append(f"-{where}")
        if self.root.attrs.get("digest") != "blake3":
            self.root.attrs["digest"] = "blake3"
        return legacy, len(dead)


class GoldenStore:
    """An icechunk repository at ``root`` (created on first write)."""

    def __init__(self, root: str | os.PathLike, *, read_cache: str | os.PathLike | None = None):
        self.location = Location.parse(root)
        # ``root`` names the store in messages; a local store's directory is ``self.location.path``
        self.root = self.location.path if not self.location.remote else self.location.url
        env = os.environ.get("PTO_STORE_READ_CACHE")
        if read_cache is None and env is not None:
            read_cache = env or None  # PTO_STORE_READ_CACHE="" turns the cache off
        elif read_cache is None:
            read_cache = default_read_cache()
        self.read_cache = None if read_cache is None else Path(read_cache)
        self.retries = 0  # optimistic commits (S3) this handle reran because the branch had moved
        self._locked = False  # this handle holds the store's lock
        self._verified: dict[str, tuple[int, int, str]] = {}  # snapshot -> (size, mtime_ns, sha256) hashed here

    @property
    def packs(self) -> Path | None:
        """This store's pack folder in the read cache (None with the cache off)."""
        if self.read_cache is None:
            return None
        name = self.location.url if self.location.remote else str(self.location.path.resolve())
        return readpack.store_packs(self.read_cache, name)

    # ---- repository ---------------------------------------------------------
    def exists(self) -> bool:
        if not self.location.remote:
            return (self.root / REPO_DIR / "repo").exists() or (self.root / REPO_DIR / "refs").exists()
        try:
            return icechunk.Repository.exists(self.location.storage())
        except Exception as exc:
            raise GoldenStoreError(unreachable(self.location, exc)) from None

    def _repo(self, *, create: bool = False, shared: bool = False) -> icechunk.Repository:
        """The repository; ``shared``: a read's, reused while the snapshot files are the ones it was opened on."""
        try:
            storage = self.location.storage()
            if create:
                if self.exists():
                    self._verify_snapshots()  # never write on top of a damaged history
                try:
                    return icechunk.Repository.open_or_create(storage)
                except Exception:
                    if not self.location.remote:
                        raise
                    return icechunk.Repository.open(storage)  # another writer created it first
            if not self.exists():
                raise GoldenStoreError(f"no golden store at {self.root} (record a case first: goldens record ...)")
            sums = self._verify_snapshots()
            if not shared or not sums:  # (a remote store's credentials come from the environment of each open)
                return icechunk.Repository.open(storage)
            key = (str(self.root.resolve()), tuple(sorted(sums.items())))
            with _REPOS_LOCK:
                if key not in _REPOS:
                    _REPOS.clear()  # the snapshot files moved (a commit, gc): those repositories are done with
                    _REPOS[key] = icechunk.Repository.open(storage)
                return _REPOS[key]
        except GoldenStoreError:
            raise
        except Exception as exc:
            raise GoldenStoreError(unreachable(self.location, exc) if self.location.remote
                                   else damaged(self.root, exc)) from exc

    # ---- snapshot checksums (local stores) ------------------------------------
    def _sums(self) -> dict[str, str]:
        path = self.root / SUMS_NAME
        try:
            sums = json.loads(path.read_text())
        except FileNotFoundError:
            return {}  # a store written before checksums: summed at its next write
        except (OSError, ValueError) as exc:
            raise GoldenStoreError(f"golden store {self.root} is damaged: {path} cannot be read ({exc}); restore the "
                                   "store directory from version control or a backup") from None
        if not isinstance(sums, dict) or not all(isinstance(v, str) for v in sums.values()):
            raise GoldenStoreError(f"golden store {self.root} is damaged: {path} is not a map of snapshot checksums; "
                                   "restore the store directory from version control or a backup")
        return sums

    def _verify_snapshots(self) -> dict[str, str]:
        """Every snapshot file still has the sha256 recorded when it was written, checked before icechunk parses
        any of them (a missing file is icechunk's to report); returns those sums ({} for a remote store)."""
        if self.location.remote:
            return {}
        folder = self.root / REPO_DIR / "snapshots"
        sums = self._sums()
        for snapshot, want in sums.items():
            try:
                got = self._sha256(folder / snapshot)
            except FileNotFoundError:
                continue
            if got != want and not self._locked:  # gc rewrites a file, then its sum, under the lock: wait
                try:
                    with self.lock(timeout=60):
                        return self._verify_snapshots()
                except GoldenStoreError as exc:
                    if "damaged" in str(exc):
                        raise
            if got != want:  # (no lock to be had, e.g. a read-only copy: what is on disk is what there is)
                raise GoldenStoreError(f"golden store {self.root} is damaged or unreadable: snapshot {snapshot} "
                                       f"({REPO_DIR}/snapshots/{snapshot}) is not the file that was written (its "
                                       f"sha256 differs from {SUMS_NAME}); restore the store directory from version "
                                       "control or a backup")
        return sums

    def _sha256(self, path: Path) -> str:
        """A snapshot file's sha256, hashed again only when its size or mtime moved (every open verifies)."""
        st = path.stat()
        known = self._verified.get(path.name)
        if known is not None and known[:2] == (st.st_size, st.st_mtime_ns):
            return known[2]
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        self._verified[path.name] = (st.st_size, st.st_mtime_ns, got)
        return got

    def _record_sums(self, *, rewritten: bool = False) -> None:
        """After a write, under the lock: sum the new snapshot files (every file when ``rewritten``: gc rewrites
        the parent of the oldest snapshot it keeps) and forget deleted ones."""
        if self.location.remote:
            return
        folder = self.root / REPO_DIR / "snapshots"
        sums = self._sums()
        files = {p.name: p for p in folder.iterdir() if p.is_file()}
        new = {k: v for k, v in sums.items() if k in files and not rewritten}
        for name, path in files.items():
            if name not in new:
                new[name] = self._sha256(path)
        if new != sums:
            tmp = self.root / f".{SUMS_NAME}.tmp"
            tmp.write_text(json.dumps(dict(sorted(new.items())), indent=0) + "\n")
            os.replace(tmp, self.root / SUMS_NAME)

    @contextlib.contextmanager
    def lock(self, *, timeout: float | None = None) -> Iterator[None]:
        """Exclusive inter-process lock for every read-modify-write of a local store (released by the kernel
        even on SIGKILL). An S3 store takes no lock: its commits are optimistic (``update``).

        The holder writes its pid and command into the lock file; a writer that has to wait says once, on
        stderr, whom it waits for, and gives up after ``timeout`` seconds (default ``PTO_STORE_LOCK_TIMEOUT``,
        else 600) with a GoldenStoreError (exit 2)."""
        if self.location.remote:
            yield
            return
        if timeout is None:
            timeout = float(os.environ.get("PTO_STORE_LOCK_TIMEOUT", "600"))
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fh = open(self.root / LOCK_NAME, "a+b", buffering=0)  # noqa: SIM115 (held across the yield)
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
                        holder = fh.read().decode(errors="replace").strip() or "another process"
                        print(f"goldens: waiting for the store lock of {self.root} held by {holder} "
                              f"(gives up after {timeout:g} s; PTO_STORE_LOCK_TIMEOUT)", file=sys.stderr)
                        told = True
                    if time.monotonic() >= deadline:
                        raise GoldenStoreError(f"golden store {self.root} is locked by {holder}; gave up after "
                                               f"{timeout:g} s (raise PTO_STORE_LOCK_TIMEOUT or stop that writer)"
                                               ) from None
                    time.sleep(0.05)
            try:
                with contextlib.suppress(OSError):  # who holds it is for the waiting message only (a full disk)
                    fh.seek(0)
                    fh.truncate()
                    fh.write(f"pid {os.getpid()} ({' '.join(sys.argv[:3])[:120]}) since "
                             f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M:%S} UTC\n".encode())
                self._locked = True
                yield
            finally:
                self._locked = False
                with contextlib.suppress(OSError):
                    fh.seek(0)
                    fh.truncate()
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def update(self, body: Callable[[Transaction], object], message: str | Callable[[object], str], *,
               metadata: dict | None = None, tag: str | None = None) -> tuple[object, CommitResult]:
        """One read-modify-write: ``body(txn)`` reads its base through ``txn.reader`` (the branch head the commit
        will go on top of) and stages changes with ``txn.write``; then one commit, tagged with ``tag`` in the
        same step. Returns (what ``body`` returned, the commit result).

        Local store: all of it under the file lock. S3: optimistic -- when another writer moved the branch
        since ``body`` read it, icechunk refuses the commit and ``body`` runs again on the new head (at most
        S3_COMMIT_ATTEMPTS times, then a GoldenStoreError: nothing of this command was committed). Tags a
        crash left behind are restored first (the tag name also rides in the snapshot's metadata)."""
        with self.lock():
            repo = self._repo(create=True)
            checked = self._restore_tags(repo)
            stamp = {TAGS_CHECKED: checked} if checked else {}  # in every commit's metadata
            attempts = S3_COMMIT_ATTEMPTS if self.location.remote else 1
            for attempt in range(attempts):
                try:
                    txn = self._open(repo, stamp)
                    session = txn.session
                    value = body(txn)
                except (icechunk.IcechunkError, OSError) as exc:  # chunks are written as they are staged
                    raise GoldenStoreError(write_failed(self.root, exc)) from exc
                if not txn.written:
                    return value, CommitResult(None, (), tuple(txn.unchanged))
                if os.environ.get("PTO_STORE_TEST_PAUSE_BEFORE_COMMIT"):  # reliability tests kill us here
                    time.sleep(float(os.environ["PTO_STORE_TEST_PAUSE_BEFORE_COMMIT"]))
                meta = {**(metadata or {}), **({"tag": tag} if tag else {}), **stamp}
                try:
                    snapshot = session.commit(message(value) if callable(message) else message, metadata=meta)
                    break
                except (icechunk.IcechunkError, OSError) as exc:
                    raise GoldenStoreError(write_failed(self.root, exc)) from exc
                except icechunk.ConflictError:
                    self.retries += 1
                    if attempt + 1 == attempts:
                        raise GoldenStoreError(
                            f"golden store {self.root}: branch main moved under this commit {attempts} times in a "
                            "row (other writers); nothing of this command was committed -- run it again"
                            ) from None
                    time.sleep(random.uniform(0.01, 0.05 * min(attempt + 1, 10)))
            if os.environ.get("PTO_STORE_TEST_PAUSE_BEFORE_TAG"):  # reliability tests kill us here
                time.sleep(float(os.environ["PTO_STORE_TEST_PAUSE_BEFORE_TAG"]))
            tag_error = ""
            if tag:
                try:
                    self._create_tag(repo, tag, snapshot)
                except Exception as exc:  # the commit is on the branch: never report it as lost or the store damaged
                    tag_error = (f"snapshot {snapshot} is on main, but its tag {tag} could not be written "
                                 f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); the "
                                 "store is fine, and the next write to it restores the tag from the snapshot's metadata")
            self._record_sums()
            # (the read cache is filled by the first read, not here: a write costs one copy of the data)
            return value, CommitResult(snapshot, tuple(txn.written), tuple(txn.unchanged), tag_error)

    def _open(self, repo: icechunk.Repository, stamp: dict, *, move_apart: bool = True) -> Transaction:
        """A transaction on a new writable session of main. A store written before BLAKE3 (no root attribute
        "digest") moves to it first (``Transaction.sweep``), in a commit of its own, so the write's commit reports
        only what the write changed; if another writer commits in between, the move rides in the write's own
        commit. A new store only gets the attribute, in the write's commit. ``stamp``: the commits' metadata of
        the tag check (``_restore_tags``)."""
        session = repo.writable_session("main")
        txn = Transaction(session, zarr.open_group(session.store, mode="a"))
        if txn.root.attrs.get("digest") == "blake3":
            return txn
        legacy, dead = txn.sweep()
        if not (move_apart and txn.written):
            return txn
        try:
            session.commit(f"store: {len(legacy)} array(s) moved to BLAKE3 content digests, {dead} unreferenced "
                           "content(s) deleted (bytes unchanged)",
                           metadata={"action": "digest-move", **stamp})
        except icechunk.ConflictError:
            return self._open(repo, stamp, move_apart=False)
        self._record_sums()  # (its snapshot file is summed like any other commit's)
        return self._open(repo, stamp)

    @staticmethod
    def _create_tag(repo: icechunk.Repository, name: str, snapshot: str) -> None:
        """Create a tag; one that already names this snapshot (another process restored it) is fine, and so is
        one gc deleted (its tombstone keeps the name: the deletion stands)."""
        try:
            repo.create_tag(name, snapshot)
        except Exception as exc:
            if not _already_exists(exc):
                raise
            try:
                current = repo.lookup_tag(name)
            except Exception:
                return  # deleted by gc --keep-regen-tags
            if current != snapshot:
                raise

    @classmethod
    def _restore_tags(cls, repo: icechunk.Repository) -> str | None:
        """A writer killed between its commit and its tag left the tag name in the snapshot's metadata:
        create the missing tags (so gc keeps those snapshots). Returns the head the check started from: the
        next commit records it as ``tags_checked``, and a later check stops there (that snapshot and every
        older one were checked then), so a write reads the snapshots since the last check, not the whole
        history (a store of 120 commits spent 0.11 s per write here)."""
        have = set(repo.list_tags())
        head = stop = None
        for snap in repo.ancestry(branch="main"):
            if snap.id == stop:
                break
            head = head or snap.id
            meta = snap.metadata or {}
            name = meta.get("tag")
            if name and name not in have:
                cls._create_tag(repo, name, snap.id)
                have.add(name)
            stop = stop or meta.get(TAGS_CHECKED)
        return head

    # ---- writing ------------------------------------------------------------
    def commit(self, arrays: dict[str, tuple[np.ndarray, dict]], group_attrs: dict[str, dict], message: str, *,
               metadata: dict | None = None, tag: str | None = None, remove: tuple[str, ...] = ()) -> CommitResult:
        """Write ``arrays`` (path -> (array, attrs)) and group attributes in one commit (``update``).

        An array whose dtype, shape, content hash and attributes equal the stored one is not rewritten;
        when nothing changes no commit is made. ``remove`` deletes groups/arrays first.
        """
        _none, result = self.update(lambda txn: txn.write(arrays, group_attrs, remove=remove), message,
                                    metadata=metadata, tag=tag)
        return result

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
        repo = self._repo(shared=True)
        try:
            session = repo.readonly_session(**self.resolve(rev))
        except GoldenStoreError:
            raise
        except Exception as exc:
            raise GoldenStoreError(f"cannot open revision {rev or 'main'} of {self.root}: {condensed(exc)}") from exc

        def open_root() -> zarr.Group | None:
            try:
                return zarr.open_group(session.store, mode="r")
            except zarr.errors.GroupNotFoundError:
                ancestry = list(repo.ancestry(snapshot_id=session.snapshot_id))  # raises on a damaged snapshot
                if len(ancestry) != 1:
                    raise GoldenStoreError(f"snapshot {session.snapshot_id} of {self.root} has no root group: the "
                                           "store is damaged (restore it from version control)") from None
                return None  # the repository's first snapshot holds nothing yet

        # (the root group is opened at its first use: a read a pack answers needs none, 3 ms a reader here)
        return StoreReader(open_root, session.snapshot_id, cache=self.read_cache, frozen=True, packs=self.packs)

    def log(self) -> list[LogEntry]:
        """The branch history, newest first, then every tagged snapshot gc has taken off that history (a tag
        keeps its snapshot, and the log keeps showing it)."""
        repo = self._repo()
        tags: dict[str, list[str]] = {}
        for name in repo.list_tags():
            try:
                tags.setdefault(repo.lookup_tag(name), []).append(name)
            except Exception:  # unreadable: goldens log names it (unreadable_tags), gc refuses to run
                continue
        entries = [LogEntry(s.id, s.written_at, s.message, dict(s.metadata or {}), tuple(sorted(tags.get(s.id, []))))
                   for s in repo.ancestry(branch="main")]
        seen = {e.snapshot for e in entries}
        for snap_id, names in sorted(tags.items()):
            if snap_id not in seen:
                s = next(iter(repo.ancestry(snapshot_id=snap_id)))
                entries.append(LogEntry(s.id, s.written_at, s.message, dict(s.metadata or {}), tuple(sorted(names))))
        return entries

    def unreadable_tags(self, repo: icechunk.Repository | None = None) -> list[tuple[str, str]]:
        """(tag, why) for every tag whose ref cannot be read: ``list_tags`` leaves such a tag out, so a local
        store's refs/ directory is read too (a deleted tag leaves a tombstone, not a tag)."""
        repo = repo or self._repo()
        on_disk = set() if self.location.remote else \
            {p.name.removeprefix("tag.") for p in (self.root / REPO_DIR / "refs").glob("tag.*")
             if not (p / "ref.json.deleted").exists()}
        out = []
        for name in sorted(set(repo.list_tags()) | on_disk):
            try:
                next(iter(repo.ancestry(tag=name)))
            except Exception as exc:
                out.append((name, damaged(self.root, exc).split(": ", 1)[1]))
        return out

    def tag(self, name: str, snapshot: str) -> None:
        with self.lock():  # (creating a tag is atomic on S3: a name that exists is refused)
            self._repo().create_tag(name, snapshot)

    def gc(self, older_than: dt.datetime, *, keep_last: int = 10, keep_regen_tags: int | None = None,
           dry_run: bool = False) -> tuple[list[LogEntry], list[str], object]:
        """Expire snapshots older than ``older_than`` -- never a tagged snapshot, the branch head or the newest
        ``keep_last`` snapshots of the branch (the cutoff moves back to the keep_last-th newest) -- then delete
        unreachable objects. ``keep_regen_tags`` N (None: all) keeps the newest N of the tags ``regen`` made
        (``regen-<time>``) and deletes an older one only when its snapshot is itself expired by these rules, so
        the snapshot goes with it; a tag anyone else made is never deleted. ``dry_run`` lists what would be
        expired and changes nothing. Refuses, changing nothing, when a tag cannot be read (its snapshot would
        lose the tag's protection). Returns (the snapshots expired, or that would be; the regen tags deleted,
        or that would be; the GC summary or None).

        On S3 no lock is taken: icechunk's expiry never touches a branch head or a tagged snapshot and its
        collection deletes only objects older than ``older_than``, so a concurrent commit (whose objects are
        new) is safe. A tag ref that cannot be listed at all is not seen there (the local store reads refs/
        from disk to catch it).

        Before the expiry, in a commit of its own (not in a dry run): arrays an older version stored with their
        own chunks become links to their content, and contents no link names any more are deleted
        (``Transaction.sweep``). What expires is decided before that commit, so a dry run lists exactly it; the
        space those contents held is freed when the snapshots still naming them expire (the next gc)."""
        with self.lock():
            repo = self._repo()
            self._restore_tags(repo)
            for name, why in self.unreadable_tags(repo):
                raise GoldenStoreError(f"gc refused: tag {name!r} of {self.root} cannot be read ({why}); nothing "
                                       "was expired")
            history = self.log()
            branch = [e for e in history if e.snapshot in {s.id for s in repo.ancestry(branch="main")}]
            if keep_last > 0 and len(branch) >= keep_last:
                older_than = min(older_than, branch[keep_last - 1].written_at)
            regen = sorted((e for e in history for t in e.tags if t.startswith(REGEN_TAG_PREFIX)),
                           key=lambda e: e.written_at, reverse=True)
            head = branch[0].snapshot if branch else None
            kept = {e.snapshot for e in branch[:max(keep_last, 1)]}
            droppable = set() if keep_regen_tags is None else \
                {e.snapshot for e in regen[keep_regen_tags:]
                 if e.written_at < older_than and e.snapshot not in kept and e.snapshot != head
                 and all(t.startswith(REGEN_TAG_PREFIX) for t in e.tags)}
            dropped = sorted(t for e in history if e.snapshot in droppable for t in e.tags)
            tagged = {e.snapshot for e in history if e.tags} - droppable
            doomed = [e for e in branch[1:-1] if e.written_at < older_than and e.snapshot not in tagged]
            doomed += [e for e in history if e.snapshot in droppable and e not in doomed]
            if dry_run:
                return doomed, dropped, None
        self.sweep()
        with self.lock():
            repo = self._repo()
            for name in dropped:  # a kill here leaves the tag deleted: the snapshot's next expiry takes it
                repo.delete_tag(name)
            repo.expire_snapshots(older_than, delete_expired_branches=False, delete_expired_tags=False)
            self._record_sums(rewritten=True)  # expiry rewrites the parent of the oldest snapshot kept
            summary = repo.garbage_collect(older_than)
            self._record_sums(rewritten=True)
            return doomed, dropped, summary

    def sweep(self) -> tuple[list[str], int, CommitResult]:
        """One commit: every array stored the old way becomes a link to its content, and contents no link names
        are deleted. (paths rewritten, contents deleted, the commit)."""
        (legacy, dead), result = self.update(lambda txn: txn.sweep(),
                                             lambda v: f"gc: {len(v[0])} array(s) stored once in the content pool, "
                                                       f"{v[1]} unreferenced content(s) deleted")
        return legacy, dead, result

    def disk_bytes(self) -> int:
        """Bytes of a local versioned store (a read cache left inside it by a version before 2026-12-03 is a
        disposable copy and does not count)."""
        if self.location.remote:
            raise GoldenStoreError(f"{self.root}: disk usage is measured for local stores only")
        return sum(p.stat().st_size for p in self.root.rglob("*")
                   if p.is_file() and READ_CACHE_DIR not in p.relative_to(self.root).parts)


def pool_path(d: str) -> str:
    """Where the content with digest ``d`` is stored."""
    return f"{POOL}/{d}"


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

    def __init__(self, root: zarr.Group | Callable[[], zarr.Group | None] | None, snapshot: str, *,
                 cache: Path | None = None, frozen: bool = False, packs: Path | None = None):
        self._root = root  # or what opens it, at the first use of ``root``
        # a snapshot never changes: each node is looked up once (a lookup is a round trip into icechunk, and a
        # tree's load asks for dozens); a transaction's reader sees its own writes, so it looks up every time
        self._nodes: dict[str, object] | None = {} if frozen else None
        self.snapshot = snapshot
        self.cache = cache
        self.packs = packs  # this store's pack folder in the read cache (GoldenStore.packs: None with no cache)

    @property
    def root(self) -> zarr.Group:
        if not isinstance(self._root, zarr.Group):
            root = self._root() if callable(self._root) else self._root
            self._root = root if root is not None else zarr.open_group(zarr.storage.MemoryStore(), mode="w")
        return self._root

    def _cache_file(self, attrs: dict) -> Path | None:
        d = attrs.get("digest")
        return None if self.cache is None or not isinstance(d, str) else \
            self.cache / d.removeprefix(DIGEST_PREFIX)[:2] / f"{d}.npy"

    def _cached(self, attrs: dict, dtype, shape) -> np.ndarray | None:
        """The array from the read cache when a verified copy is there: same dtype and shape as the stored
        array and the stored CRC32C (a damaged or foreign cache file is dropped and the store is read)."""
        f = self._cache_file(attrs)
        if f is None or not f.is_file() or f.is_symlink():
            return None
        try:
            data = _map_npy(f)
        except (OSError, ValueError):
            data = None
        if data is None or data.dtype != dtype or data.shape != tuple(shape) or \
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

    def _get(self, path: str):
        if self._nodes is None:
            return self.root.get(path)
        if path not in self._nodes:
            self._nodes[path] = self.root.get(path)
        return self._nodes[path]

    def _prefetch(self, paths) -> None:
        """Look up every path not looked up yet in one gather (a frozen reader only)."""
        todo = sorted({p for p in paths if p} - set(self._nodes or ()))
        if self._nodes is None or not todo:
            return
        from zarr.core.sync import sync

        group = self.root._async_group

        async def get(path: str):
            try:
                node = await group.getitem(path)
            except KeyError:
                return None
            return zarr.Array(node) if isinstance(node, zarr.AsyncArray) else zarr.Group(node)

        try:
            found = sync(_all(*(get(p) for p in todo)))
        except Exception:
            return  # each path is then looked up alone, and a failure named where it happens
        self._nodes.update(zip(todo, found, strict=True))

    def has(self, path: str) -> bool:
        return path in self.root if self._nodes is None else self._get(path) is not None

    def group_attrs(self, path: str) -> dict:
        node = self._get(path)
        if not isinstance(node, zarr.Group):
            raise GoldenStoreError(f"no group {path!r} in snapshot {self.snapshot}")
        return dict(node.attrs)

    def arrays(self, path: str) -> list[str]:
        node = self._get(path)
        if not isinstance(node, zarr.Group):
            return []
        return sorted(name for name, _ in node.arrays())

    def groups(self, path: str = "") -> list[str]:
        node = self.root if not path else self._get(path)
        if not isinstance(node, zarr.Group):
            return []
        return sorted(name for name, _ in node.groups() if path or name != POOL)

    def _data(self, path: str, node: zarr.Array) -> zarr.Array:
        """The array holding ``path``'s content: its pool entry for a link, else the array itself."""
        where = node.attrs.get("pool")
        if not where:
            return node
        data = self._get(where)
        if not isinstance(data, zarr.Array) or data.shape != node.shape or data.dtype != node.dtype:
            raise GoldenStoreError(f"array {path!r}: its content {where} is missing or is not {node.dtype} "
                                   f"{node.shape} in snapshot {self.snapshot}; the store is damaged")
        return data

    def array_attrs(self, path: str) -> dict:
        node = self._get(path)
        if not isinstance(node, zarr.Array):
            raise GoldenStoreError(f"missing array {path!r} in snapshot {self.snapshot}")
        return dict(node.attrs)

    def read(self, path: str) -> tuple[np.ndarray, dict]:
        """(array, attrs); a missing array, or a chunk that fails its checksum or decompression, raises
        GoldenStoreError naming the array."""
        node = self._get(path)
        if not isinstance(node, zarr.Array):
            raise GoldenStoreError(f"missing array {path!r} in snapshot {self.snapshot}")
        content = self._data(path, node)
        try:
            data = content[()] if node.ndim == 0 else content[...]
        except Exception as exc:
            raise GoldenStoreError(f"array {path!r}: cannot read its chunks ({type(exc).__name__}: {condensed(exc)}); "
                                   "the store may be corrupted or truncated") from exc
        return _verified(path, data, node)

    def read_many(self, paths: list[str]) -> dict[str, tuple[np.ndarray, dict]]:
        """Read several arrays: each from the verified read cache when it is there (memory-mapped, CRC32C
        checked, concurrently), the others in one gather on zarr's event loop (I/O and decompression of
        different arrays overlap) and then cached; same checks as ``read``. A failing array is re-read
        alone so the error names it. A frozen reader with a cache answers a read it has answered before
        (same snapshot, same paths) from its pack (``goldens.readpack``): one file, no store lookup."""
        pack = None if self._nodes is None or self.packs is None else \
            readpack.pack_file(self.packs, self.snapshot, list(paths))
        if pack is not None:
            got = self._from_pack(pack, list(paths))
            if got is not None:
                return got
        out = self._read_many(paths)
        if pack is not None:
            with contextlib.suppress(OSError):  # best effort, as the read cache: a full disk loses the speed-up
                readpack.save(pack, self.snapshot, list(paths), out, lambda a: a.nbytes < CACHE_MIN_BYTES)
        return out

    def _from_pack(self, pack: Path, paths: list[str]) -> dict[str, tuple[np.ndarray, dict]] | None:
        """``read_many``'s answer from its pack, every array verified (the small ones against the CRC32C
        their attributes record, the large ones through the read cache); None when any is not there."""
        entries = readpack.load(pack, self.snapshot, paths)
        if entries is None:
            with contextlib.suppress(OSError):
                pack.unlink()  # damaged or another read's: rewritten after this read
            return None
        large = [e for e in entries if e["data"] is None]  # mapped and checked on the worker pool, side by side,
        large.sort(key=lambda e: -math.prod(e["shape"]) * np.dtype(e["dtype"]).itemsize)  # the largest first
        mapped = dict(zip((e["path"] for e in large),
                          workers.pool().map(lambda e: self._cached(e["attrs"], e["dtype"], e["shape"]), large),
                          strict=True))
        out = {}
        for e in entries:
            data = e["data"]
            if data is None:
                data = mapped[e["path"]]
            elif e["attrs"].get("crc32c") is not None and checksum(data) != e["attrs"]["crc32c"]:
                data = None  # (as a store read: an array written before checksums has none to check)
            if data is None:
                return None
            out[e["path"]] = (data, e["attrs"])
        return out

    def _read_many(self, paths: list[str]) -> dict[str, tuple[np.ndarray, dict]]:
        self._prefetch(paths)
        nodes = {}
        for path in paths:
            node = self._get(path)
            if not isinstance(node, zarr.Array):
                raise GoldenStoreError(f"missing array {path!r} in snapshot {self.snapshot}")
            nodes[path] = node
        cached = dict(zip(nodes, workers.pool().map(lambda n: self._cached(dict(n.attrs), n.dtype, n.shape), nodes.values()),
                          strict=True)) if self.cache is not None else dict.fromkeys(nodes)
        out = {p: (cached[p], dict(n.attrs)) for p, n in nodes.items() if cached[p] is not None}
        missing = {p: n for p, n in nodes.items() if cached[p] is None}
        if not missing:
            return out
        self._prefetch(n.attrs.get("pool") for n in missing.values())  # (the contents of what the cache lacks)
        try:
            from zarr.core.sync import sync

            contents = [self._data(p, n) for p, n in missing.items()]

            async def gather():
                return await asyncio.gather(*(n._async_array.getitem(() if n.ndim == 0 else ...)
                                              for n in contents))

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
        node = self.root if not path else self._get(path)
        if not isinstance(node, zarr.Group):
            return out
        for name, child in node.members():
            if not path and name == POOL:
                continue
            full = f"{path}/{name}" if path else name
            if isinstance(child, zarr.Array):
                out.append(full)
            else:
                out.extend(self.walk_arrays(full))
        return sorted(out)
