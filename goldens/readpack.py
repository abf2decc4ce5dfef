"""Packed reads: what one ``StoreReader.read_many`` of a snapshot returned, kept in the read cache as one file.

A replay reads each tree with one ``read_many`` of a few dozen arrays, most of them tiny. From the store
that costs two node lookups and one zarr read per array (~55 ms for a 35-array tree here); from a pack it
is one file read. A snapshot never changes, so (snapshot id, the paths asked for) names the answer for
good; the pack keeps each array's attributes, dtype and shape, and the bytes of the arrays smaller than the
read cache's threshold (the larger ones stay in the content-addressed read cache, and a pack whose large
array is not there is not used).

File: ``PTOPACK1``, the 32-byte BLAKE3 of the rest, then a little-endian u64 header length, the JSON header
(snapshot, paths, one entry per path) and the payload, each array's bytes 64-byte aligned. A file whose
hash, header or snapshot/paths do not match is ignored (and removed by the caller); each small array is
also checked against the CRC32C its attributes record, as a store read is. No pickle anywhere.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path

import blake3
import numpy as np

MAGIC = b"PTOPACK1"
ALIGN = 64
PACK_DIR = "packs"


KEEP_SNAPSHOTS = 4  # the packs of this many snapshots are kept (the newest written); older ones are deleted
KEEP_STORE_DAYS = 14  # a store whose packs were not added to for this long is gone or idle: its folder goes


def store_packs(cache: Path, store: str) -> Path:
    """The folder of one store's packs under the read cache ``cache``: each store keeps its own newest
    snapshots (the content-addressed arrays beside it are shared by every store)."""
    return cache / PACK_DIR / blake3.blake3(store.encode()).hexdigest(length=8)


def pack_file(packs: Path, snapshot: str, paths: list[str]) -> Path:
    """Where the pack of ``paths`` read from ``snapshot`` lives in a store's pack folder ``packs``."""
    key = blake3.blake3("\n".join([snapshot, *paths]).encode()).hexdigest(length=16)
    return packs / snapshot / f"{key}.pack"


def _folders(root: Path) -> list[tuple[int, Path]]:
    """(mtime in ns, folder) of every folder in ``root``, oldest first; none when it cannot be listed."""
    try:
        return sorted((p.stat().st_mtime_ns, p) for p in root.iterdir() if p.is_dir())
    except OSError:
        return []


def _remove(folders) -> None:
    import shutil

    for _mtime, p in folders:
        shutil.rmtree(p, ignore_errors=True)


def prune(packs: Path, keep: int = KEEP_SNAPSHOTS) -> None:
    """Delete the pack folders of all but the ``keep`` snapshots whose folders were made last (every regen
    makes a snapshot, and a developer's cache would otherwise keep a pack of every tree for each). Best
    effort: a reader that loses its pack meanwhile reads the store."""
    folders = _folders(packs)
    _remove(folders[: max(0, len(folders) - keep)])


def prune_stores(root: Path, days: float = KEEP_STORE_DAYS) -> None:
    """Delete the pack folders of the stores under ``root`` no pack was written to for ``days`` (test stores,
    deleted clones; a store read since keeps its folder only if a read wrote a pack). Best effort, as
    ``prune``."""
    import time

    cutoff = time.time_ns() - int(days * 86400e9)
    _remove(f for f in _folders(root) if f[0] < cutoff)


def save(f: Path, snapshot: str, paths: list[str], entries: dict[str, tuple[np.ndarray, dict]],
         keep_bytes) -> None:
    """Write the pack of ``entries`` ({path: (array, attrs)}, one per path); ``keep_bytes(array)`` says
    whether the pack holds the array's bytes. Atomic (a temporary file renamed); raises OSError."""
    header, pieces, offset = [], [], 0
    for path in paths:
        data, attrs = entries[path]
        data = np.asarray(data, order="C")  # (not ascontiguousarray: it makes a 0-d array 1-d)
        entry = {"path": path, "attrs": attrs, "dtype": data.dtype.str, "shape": list(data.shape), "offset": None}
        if keep_bytes(data):
            pad = -offset % ALIGN
            pieces += [b"\0" * pad, data.tobytes()]
            offset += pad
            entry["offset"] = offset
            offset += data.nbytes
        header.append(entry)
    head = json.dumps({"snapshot": snapshot, "paths": paths, "entries": header}, separators=(",", ":")).encode()
    start = 8 + len(head)
    lead = b"\0" * (-(len(MAGIC) + 32 + start) % ALIGN)  # the payload starts aligned in the file
    body = b"".join([struct.pack("<Q", len(head) + len(lead)), head, lead, *pieces])
    if not f.parent.is_dir():  # the first pack of a snapshot: older snapshots' packs may go
        if not f.parent.parent.is_dir():  # and the first of a store: the folders of stores long idle
            prune_stores(f.parent.parent.parent)
        f.parent.mkdir(parents=True, exist_ok=True)
        prune(f.parent.parent)
    tmp = f.with_name(f".{f.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(MAGIC + blake3.blake3(body).digest() + body)
        os.replace(tmp, f)
        os.utime(f.parent.parent)  # the store's folder: the date ``prune_stores`` goes by
    finally:
        if tmp.exists():
            tmp.unlink()


def load(f: Path, snapshot: str, paths: list[str]) -> list[dict] | None:
    """The pack's entries, in ``paths``' order, each {path, attrs, dtype, shape, data (None where the bytes
    are in the content cache)}; None when there is no usable pack (absent, damaged, or another read's)."""
    try:
        with open(f, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            buf = bytearray(size)  # writable: the arrays handed out may be written to, as a store read's
            if fh.readinto(buf) != size:
                return None
    except OSError:
        return None
    view = memoryview(buf)
    if size < len(MAGIC) + 40 or view[: len(MAGIC)] != MAGIC:
        return None
    body = view[len(MAGIC) + 32:]
    if blake3.blake3(body).digest() != bytes(view[len(MAGIC): len(MAGIC) + 32]):
        return None
    (hlen,) = struct.unpack_from("<Q", body)
    try:
        head = json.loads(bytes(body[8: 8 + hlen]).rstrip(b"\0"))
    except ValueError:
        return None
    if head.get("snapshot") != snapshot or head.get("paths") != paths:
        return None
    base = len(MAGIC) + 32 + 8 + hlen
    out = []
    for e in head["entries"]:
        dtype, shape = np.dtype(e["dtype"]), tuple(e["shape"])
        data = None
        if e["offset"] is not None:
            count = int(np.prod(shape, dtype=np.int64))
            data = np.frombuffer(buf, dtype=dtype, count=count, offset=base + e["offset"]).reshape(shape)
        out.append({"path": e["path"], "attrs": e["attrs"], "dtype": dtype, "shape": shape, "data": data})
    return out
