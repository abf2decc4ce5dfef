"""Reading a snapshot of the golden store (``StoreReader``): arrays and attributes by path, checked against their
stored CRC32C, served from the read-only pack or the local read cache when they hold the same bytes, many at once
on the worker pool. Takes no lock. Spec: §7.3.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import mmap
import os
import threading
from collections.abc import Callable
from pathlib import Path

import crc32c
import numpy as np
import zarr
import zarr.codecs
import zarr.errors
import zarr.storage

from goldens import readpack
from goldens.errors import GoldenStoreError
from goldens.store_format import (
    CACHE_MIN_BYTES,
    DIGEST_PREFIX,
    MADV_POPULATE_READ,
    POOL,
    _all,
    checksum,
    condensed,
)
from kernels import workers


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


class _Fetched(zarr.storage.WrapperStore):
    """The store, answering a whole-chunk get from the bytes the chunk fingerprints were taken of:
    a read-cache miss decodes what was fetched for the check instead of fetching it again (#48). The bytes live
    as long as the read_many that fetched them."""

    def __init__(self, store, fetched: dict):
        super().__init__(store)
        self._fetched = fetched  # chunk key -> the bytes fetched for the check (None: no such chunk)

    async def get(self, key, prototype, byte_range=None):
        if byte_range is None and key in self._fetched:
            return self._fetched[key]
        return await self._store.get(key, prototype, byte_range)

    @staticmethod
    def reading(node: zarr.Array, fetched: dict | None):
        """``node``'s async array, reading through the bytes fetched from its store (``fetched``: store id ->
        chunk key -> bytes) when there are any."""
        array = node._async_array
        mine = (fetched or {}).get(id(node.store_path.store))
        if not mine:
            return array
        from zarr.core.array import AsyncArray
        from zarr.storage import StorePath

        wrapped = _Fetched(node.store_path.store, mine)
        return AsyncArray(metadata=array.metadata, store_path=StorePath(wrapped, node.store_path.path),
                          config=array.config)


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

    def _cache_file(self, attrs: dict, chunks: str | None) -> Path | None:
        """The cache entry of an array: named by its content digest and by the fingerprint of the store's own
        chunk bytes holding it (``_chunk_fingerprints``), so a chunk damaged in the store names another entry,
        the store is read, and its checksum fails there (#48: the cache never hides damage)."""
        d = attrs.get("digest")
        return None if self.cache is None or not isinstance(d, str) or not chunks else \
            self.cache / d.removeprefix(DIGEST_PREFIX)[:2] / f"{d}.{chunks}.npy"

    def _chunk_fingerprints(self, contents: dict[str, zarr.Array],
                            keep: dict | None = None) -> dict[str, str | None]:
        """{path: CRC32C fingerprint of the raw (encoded) chunk bytes the store holds for it}, all fetched in one
        gather without decoding; None for an array whose chunks cannot be fetched (then nothing is served from
        the cache for it, and the store read names the failure). ``keep``: filled with the fetched bytes by chunk
        key, so a cache miss decodes them instead of fetching them again (``_Fetched``)."""
        import itertools

        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        prototype = default_buffer_prototype()

        async def one(node: zarr.Array) -> str | None:
            grid = [range(-(-s // c)) for s, c in zip(node.shape, node.chunks, strict=True)] if node.ndim else []
            store, base = node.store_path.store, node.store_path.path
            keys = [f"{base}/{node.metadata.encode_chunk_key(coords)}" for coords in itertools.product(*grid)]
            bufs = await asyncio.gather(*(store.get(k, prototype=prototype) for k in keys))
            crc = 0
            for key, buf in zip(keys, bufs, strict=True):
                raw = b"" if buf is None else buf.to_bytes()
                crc = int(crc32c.crc32c(key.encode() + len(raw).to_bytes(8, "little") + raw, crc))
            if keep is not None:  # {store: {chunk key: bytes}} (the store object is alive through the read)
                keep.setdefault(id(store), {}).update(zip(keys, bufs, strict=True))
            return f"{crc:08x}{len(keys):x}"

        async def gather():
            return await asyncio.gather(*(one(n) for n in contents.values()), return_exceptions=True)

        try:
            found = sync(gather())
        except Exception:  # noqa: BLE001 (the store read below names what fails)
            return dict.fromkeys(contents)
        return {p: (None if isinstance(f, BaseException) else f) for p, f in zip(contents, found, strict=True)}

    def _cached(self, attrs: dict, dtype, shape, chunks: str | None = None) -> np.ndarray | None:
        """The array from the read cache when a verified copy is there: same dtype and shape as the stored
        array and the stored CRC32C, under the fingerprint of the store's chunk bytes it was read from (a
        damaged or foreign cache file is dropped and the store is read)."""
        f = self._cache_file(attrs, chunks)
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

    def _to_cache(self, node: zarr.Array, data: np.ndarray, chunks: str | None) -> None:
        self.store_in_cache(data, dict(node.attrs), chunks)

    def store_in_cache(self, data: np.ndarray, attrs: dict, chunks: str | None) -> None:
        f = self._cache_file(attrs, chunks)
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
        fetched: dict = {}  # the raw chunk bytes the fingerprints were taken of: a miss decodes these
        fps = self._fingerprints_of(paths, keep=fetched) if self.cache is not None else {}
        keyed = self._keyed(paths, fps)  # a pack names the chunk bytes it was read from
        pack = None if self._nodes is None or self.packs is None or None in fps.values() else \
            readpack.pack_file(self.packs, self.snapshot, keyed)
        if pack is not None:
            got = self._from_pack(pack, keyed, fps)
            if got is not None:
                return got
        out = self._read_many(paths, fps, fetched)
        if pack is not None:
            with contextlib.suppress(OSError):  # best effort, as the read cache: a full disk loses the speed-up
                readpack.save(pack, self.snapshot, keyed, {k: out[p] for k, p in zip(keyed, paths, strict=True)},
                              lambda a: a.nbytes < CACHE_MIN_BYTES)
        return out

    @staticmethod
    def _keyed(paths, fps: dict) -> list[str]:
        return [f"{p}#{fps.get(p)}" for p in paths]

    def pack_keys(self, paths: list[str]) -> list[str]:
        """The names a pack of ``paths`` is filed and checked under: each path with the fingerprint of the store's
        chunk bytes for it (``readpack.pack_file`` / ``readpack.load`` take these)."""
        return self._keyed(paths, self._fingerprints_of(paths))

    def _fingerprints_of(self, paths, keep: dict | None = None) -> dict[str, str | None]:
        """The chunk fingerprint of every path's content (its pool entry for a link); None where a node is not
        an array (the read then names it). ``keep``: as ``_chunk_fingerprints``."""
        self._prefetch(paths)
        nodes = {p: self._get(p) for p in paths}
        self._prefetch(n.attrs.get("pool") for n in nodes.values() if isinstance(n, zarr.Array))
        contents = {}
        for p, n in nodes.items():
            if isinstance(n, zarr.Array):
                with contextlib.suppress(GoldenStoreError):
                    contents[p] = self._data(p, n)
        found = self._chunk_fingerprints(contents, keep) if contents else {}
        return {p: found.get(p) for p in paths}

    def _from_pack(self, pack: Path, paths: list[str], fps: dict) -> dict[str, tuple[np.ndarray, dict]] | None:
        """``read_many``'s answer from its pack (``paths``: each path keyed by its chunk fingerprint), every
        array verified (the small ones against the CRC32C their attributes record, the large ones through the
        read cache); None when any is not there."""
        entries = readpack.load(pack, self.snapshot, paths)
        if entries is None:
            with contextlib.suppress(OSError):
                pack.unlink()  # damaged or another read's: rewritten after this read
            return None
        large = [e for e in entries if e["data"] is None]  # mapped and checked on the worker pool, side by side,
        large.sort(key=lambda e: -math.prod(e["shape"]) * np.dtype(e["dtype"]).itemsize)  # the largest first
        mapped = dict(zip((e["path"] for e in large),
                          workers.pool().map(lambda e: self._cached(e["attrs"], e["dtype"], e["shape"],
                                                                    fps.get(e["path"].rsplit("#", 1)[0])), large),
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
            out[e["path"].rsplit("#", 1)[0]] = (data, e["attrs"])
        return out

    def _read_many(self, paths: list[str], fps: dict, fetched: dict | None = None) -> dict[str, tuple[np.ndarray, dict]]:
        self._prefetch(paths)
        nodes = {}
        for path in paths:
            node = self._get(path)
            if not isinstance(node, zarr.Array):
                raise GoldenStoreError(f"missing array {path!r} in snapshot {self.snapshot}")
            nodes[path] = node
        cached = dict(zip(nodes, workers.pool().map(lambda pn: self._cached(dict(pn[1].attrs), pn[1].dtype, pn[1].shape,
                                                                            fps.get(pn[0])), nodes.items()),
                          strict=True)) if self.cache is not None else dict.fromkeys(nodes)
        out = {p: (cached[p], dict(n.attrs)) for p, n in nodes.items() if cached[p] is not None}
        missing = {p: n for p, n in nodes.items() if cached[p] is None}
        if not missing:
            return out
        self._prefetch(n.attrs.get("pool") for n in missing.values())  # (the contents of what the cache lacks)
        try:
            from zarr.core.sync import sync

            contents = [_Fetched.reading(self._data(p, n), fetched) for p, n in missing.items()]

            async def gather():
                return await asyncio.gather(*(n.getitem(() if n.ndim == 0 else ...) for n in contents))

            datas = sync(gather())
        except Exception:
            datas = None
        for i, (path, node) in enumerate(missing.items()):
            data, attrs = self.read(path) if datas is None else _verified(path, datas[i], node)  # names a failure
            out[path] = (data, attrs)
            self._to_cache(node, data, fps.get(path))
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
