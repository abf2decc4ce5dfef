"""The golden store's format, shared by its reader and its writer: where a store is (``Location``: a directory or
``s3://bucket/prefix``), the names and numbers of its layout (the lock, the snapshot sums, the content pool, the
chunk size), content digests and checksums, and the one-line messages that name a damaged, unreachable or
unwritable store. Spec: §7.3.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path

import blake3
import crc32c
import icechunk
import numpy as np

from goldens.errors import GoldenStoreError

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
        if not text.strip():  # Path("") is the current folder: a store nobody named (#48)
            raise GoldenStoreError("store '': an empty location (give a local directory or s3://bucket/prefix)")
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


async def _all(*aws) -> list:
    """``asyncio.gather`` that waits for every awaitable and then raises the first failure: none is left running
    or unretrieved (a full disk fails many chunk writes at once, and asyncio would print each one)."""
    out = await asyncio.gather(*aws, return_exceptions=True)
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return out


def pool_path(d: str) -> str:
    """Where the content with digest ``d`` is stored."""
    return f"{POOL}/{d}"
