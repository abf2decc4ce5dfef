"""Writing arrays into one snapshot of the golden store (``Transaction``): each distinct content stored once under
``pool/<digest>`` and linked from the trees that name it, compressed only when a sample shrinks, chunked along the
first dimension, each chunk written as soon as its bytes are hashed. ``goldens.store.GoldenStore`` opens and
commits the transaction under its lock. Spec: §7.3.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass

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

from goldens.catalog import record_checksum
from goldens.errors import GoldenStoreError
from goldens.store_format import (
    CHUNK_BYTES,
    COMPRESS_BELOW,
    POOL,
    _all,
    checksum,
    current_digest,
    digest,
    pool_path,
)
from goldens.store_read import StoreReader
from kernels import workers


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
