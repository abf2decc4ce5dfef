"""The storage layer: an icechunk repository (Zarr v3) per store root -- a local directory or an S3 prefix
(``s3://bucket/prefix``). Knows keys, bytes, attributes and snapshots only -- not cases, operators or
comparators.

Every read-modify-write reads its base and commits in one step that cannot lose another writer's commit:
on a local directory under an exclusive file lock (icechunk on a local filesystem can silently lose
concurrent commits); on S3 as an optimistic transaction -- S3's conditional writes make icechunk refuse a
commit whose branch moved since its base was read, and the whole read-modify-write is then rerun on the new
head. Reads use read-only sessions and take no lock, so readers (pytest-xdist workers) never block or
corrupt writers. Only arrays whose bytes changed are rewritten.

Spec: §7.3 (save/replay), §7.2 (per-wiring trees)."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import math
import os
import random
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import icechunk
import numpy as np
import zarr
import zarr.codecs
import zarr.errors
import zarr.storage

from goldens import readpack
from goldens.errors import GoldenStoreError
from goldens.store_format import (
    LOCK_NAME,
    READ_CACHE_DIR,
    REGEN_TAG_PREFIX,
    REPO_DIR,
    SUMS_NAME,
    TAGS_CHECKED,
    Location,
    _already_exists,
    condensed,
    damaged,
    default_read_cache,
    unreachable,
    write_failed,
)
from goldens.store_read import StoreReader
from goldens.store_write import CommitResult, Transaction

# Commits are serialized by our own file lock, so icechunk's local-filesystem concurrency warning is noise.
if not os.environ.get("ICECHUNK_LOG"):
    with contextlib.suppress(Exception):
        icechunk.set_logs_filter("off")  # every error reaches us as an exception, said in one line


S3_COMMIT_ATTEMPTS = 50  # an optimistic commit on S3 reruns its read-modify-write this often before giving up


# The local repositories reads opened in this process, reused: a new Repository parses each snapshot it reads
# anew (12 ms for the sample store's), a reused one keeps them (a snapshot never changes; every session still
# reads its branch head from the storage, and the snapshot files are checked before each open as always).
_REPOS: dict[str, icechunk.Repository] = {}


_REPOS_LOCK = threading.Lock()


@dataclass(frozen=True)
class LogEntry:
    snapshot: str
    written_at: dt.datetime
    message: str
    metadata: dict
    tags: tuple[str, ...]


def lock_timeout() -> float:
    """``PTO_STORE_LOCK_TIMEOUT`` in seconds (default 600): a finite number >= 0, else a usage error naming it."""
    text = os.environ.get("PTO_STORE_LOCK_TIMEOUT", "600")
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise GoldenStoreError(f"PTO_STORE_LOCK_TIMEOUT={text!r}: expected a number of seconds >= 0")
    return value


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
        self.damaged_snapshots: dict[str, str] = {}  # snapshot -> why, found by a read's open (not its own)
        self.missing_snapshots: list[str] = []

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
            sums = self._verify_snapshots(strict=not shared)  # a read refuses only the snapshot it reads (reader);
            # log, diff's history, gc and every write still refuse a damaged history
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

    def _verify_snapshots(self, *, strict: bool = True) -> dict[str, str]:
        """Every snapshot file still has the sha256 recorded when it was written, checked before icechunk parses
        any of them (a missing file is icechunk's to report); returns those sums ({} for a remote store).
        ``strict`` (a write): a damaged snapshot anywhere is an error -- never write on top of a damaged history.
        Not strict (a read): the damaged ones are kept in ``damaged_snapshots`` and only a read of one of them is
        refused (``reader``), so a damaged old tag does not block replaying main."""
        if self.location.remote:
            return {}
        folder = self.root / REPO_DIR / "snapshots"
        sums = self._sums()
        self.damaged_snapshots = {}
        self.missing_snapshots = []  # summed when written, gone now: a gc killed before it forgot them, or damage
        for snapshot, want in sums.items():
            try:
                got = self._sha256(folder / snapshot)
            except FileNotFoundError:
                self.missing_snapshots.append(snapshot)
                continue
            if got != want and not self._locked:  # gc rewrites a file, then its sum, under the lock: wait
                try:
                    with self.lock(timeout=60):
                        return self._verify_snapshots(strict=strict)
                except GoldenStoreError as exc:
                    if "damaged" in str(exc):
                        raise
            if got != want:  # (no lock to be had, e.g. a read-only copy: what is on disk is what there is)
                why = (f"golden store {self.root} is damaged or unreadable: snapshot {snapshot} "
                       f"({REPO_DIR}/snapshots/{snapshot}) is not the file that was written (its sha256 differs from "
                       f"{SUMS_NAME}); restore the store directory from version control or a backup")
                if strict:
                    raise GoldenStoreError(why)
                self.damaged_snapshots[snapshot] = why
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
            timeout = lock_timeout()
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
               metadata: dict | Callable[[object], dict] | None = None, tag: str | None = None) -> tuple[object, CommitResult]:
        """One read-modify-write: ``body(txn)`` reads its base through ``txn.reader`` (the branch head the commit
        will go on top of) and stages changes with ``txn.write``; then one commit, tagged with ``tag`` in the
        same step. Returns (what ``body`` returned, the commit result).

        Local store: all of it under the file lock. S3: optimistic -- when another writer moved the branch
        since ``body`` read it, icechunk refuses the commit and ``body`` runs again on the new head (at most
        S3_COMMIT_ATTEMPTS times, then a GoldenStoreError: nothing of this command was committed). Tags a
        crash left behind are restored first (the tag name also rides in the snapshot's metadata)."""
        with self.lock():
            repo = self._repo(create=True)
            if self.missing_snapshots:  # never write on top of a history with a snapshot file gone
                self._walk_history(repo)
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
                meta = {**((metadata(value) if callable(metadata) else metadata) or {}), **({"tag": tag} if tag else {}),
                        **stamp}
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
            for name, why in self.unreadable_tags(repo):  # a tag that is there but damaged is not "unknown"
                if name == rev:
                    raise GoldenStoreError(f"tag {rev!r} of {self.root} cannot be read ({why})") from None
            raise GoldenStoreError(f"unknown revision {rev!r}: not 'main', a tag ({sorted(repo.list_tags())}) "
                                   "or a snapshot id (see goldens log)") from None
        return {"snapshot_id": rev}

    def _walk_history(self, repo: icechunk.Repository) -> None:
        """Every snapshot of main's history parses (a GoldenStoreError naming the store when one does not)."""
        try:
            for _snap in repo.ancestry(branch="main"):
                pass
        except Exception as exc:
            raise GoldenStoreError(damaged(self.root, exc)) from None

    def history_problems(self) -> list[str]:
        """What of the history a read of main does not need but log, --rev, record, regen and gc do: each tag
        whose ref cannot be read, and a break in main's ancestry (a snapshot file missing or unparsable) -- one
        line each. (Damaged snapshot files found by their sums are in ``damaged_snapshots``.)"""
        repo = self._repo()
        out = [f"tag {name!r} cannot be read ({why})" for name, why in self.unreadable_tags(repo)]
        try:
            self._walk_history(repo)
        except GoldenStoreError as exc:
            out.append(f"main's history cannot be walked: {str(exc).split(': ', 1)[1]}")
        return out

    def reader(self, rev: str | None = None) -> StoreReader:
        repo = self._repo(shared=True)
        try:
            session = repo.readonly_session(**self.resolve(rev))
        except GoldenStoreError:
            raise
        except Exception as exc:
            raise GoldenStoreError(f"cannot open revision {rev or 'main'} of {self.root}: {condensed(exc)}") from exc
        if session.snapshot_id in self.damaged_snapshots:  # the snapshot this read needs (others do not block it)
            raise GoldenStoreError(self.damaged_snapshots[session.snapshot_id])

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
            self._prune_tag_tombstones(repo)
            return doomed, dropped, summary

    def _prune_tag_tombstones(self, repo: icechunk.Repository) -> list[str]:
        """Under the lock, after an expiry: a deleted tag leaves a tombstone (its ref folder, two files: about 8 KiB
        on disk each, most of a small store's refs); one whose snapshot is no longer on the branch can never be
        restored from that snapshot's metadata (``_restore_tags``), so its folder is removed. Local stores only.
        Returns the tag names pruned."""
        if self.location.remote:
            return []
        on_branch = {snap.id for snap in repo.ancestry(branch="main")}
        pruned = []
        for folder in sorted((self.root / REPO_DIR / "refs").glob("tag.*")):
            ref = folder / "ref.json"
            if not (folder / "ref.json.deleted").exists() or not ref.is_file():
                continue
            try:
                snapshot = json.loads(ref.read_text()).get("snapshot")
            except (OSError, ValueError, AttributeError):
                continue  # not a tombstone this code understands: left alone
            if snapshot and snapshot not in on_branch:
                shutil.rmtree(folder)
                pruned.append(folder.name.removeprefix("tag."))
        return pruned

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
