"""The project's own damage suite (#48 item 6, second part): one file of a store damaged at a time -- chunks,
manifests, snapshots, refs, tags, the snapshot sums, the lock, the read cache and its packs -- and the commands a
user runs next. Store damage: `replay` and `doctor` exit 2 with one line naming the store (never a traceback,
never a PASS); damage to the read cache: nothing to report, the replay passes from the store. Either way no
command changes a byte of the damaged store, and once the file is restored the store replays as before: nothing
was lost or misreported.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from goldens import cli, trees
from goldens.store import GoldenStore
from goldens.store_format import REPO_DIR


def _files(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A store of three trees with two commits and an old tag, and a warm read cache: copied for each damage."""
    base = tmp_path_factory.mktemp("damage")
    s = GoldenStore(base / "store", read_cache=base / "cache")
    trees.record(s, [("sp_slabs", "replicated"), ("v4_prefill_indexer", "replicated")], seed=3)
    trees.record(s, [("rope_rows", "replicated")], seed=3)
    repo = s._repo()
    repo.create_tag("regen-old", [a.id for a in repo.ancestry(branch="main")][1])
    reader = s.reader()
    for case, wiring in (("sp_slabs", "replicated"), ("v4_prefill_indexer", "replicated")):
        reader.read_many(reader.walk_arrays(f"{case}/{wiring}"))
        s.reader().read_many(reader.walk_arrays(f"{case}/{wiring}"))
    return base


def _new_process() -> None:
    """Each goldens command is a process of its own: forget the repositories this one opened (icechunk keeps what it
    parsed, the damaged manifest included, for the life of a Repository)."""
    from goldens import store as store_module

    with store_module._REPOS_LOCK:
        store_module._REPOS.clear()


def _largest(folder: Path, rank: int = 0) -> Path:
    return sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: -p.stat().st_size)[rank]


def _head(root: Path) -> Path:
    import json

    ref = json.loads((root / REPO_DIR / "refs" / "branch.main" / "ref.json").read_text())
    return root / REPO_DIR / "snapshots" / ref["snapshot"]


def _flip(p: Path) -> None:
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0xFF
    p.write_bytes(bytes(b))


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: max(1, p.stat().st_size // 2)])


def _garbage(p: Path) -> None:
    p.write_bytes(b"\x00not what was written\xff")


def _delete(p: Path) -> None:
    p.unlink()


WHERE = {
    "largest chunk": lambda r: _largest(r / REPO_DIR / "chunks"),
    "second chunk": lambda r: _largest(r / REPO_DIR / "chunks", 1),
    "largest manifest": lambda r: _largest(r / REPO_DIR / "manifests"),
    "head snapshot": _head,
    "main ref": lambda r: r / REPO_DIR / "refs" / "branch.main" / "ref.json",
    "snapshot sums": lambda r: r / "pto-snapshot-sums.json",
}
HOW = {"flipped": _flip, "truncated": _truncate, "garbage": _garbage, "deleted": _delete}
# (where, how, replay's exit code): every store damage exits 2; a damaged sums file is refused (exit 2), a deleted
# one is a store written before checksums (summed again at the next write): the replay passes
STORE_DAMAGE = [(w, h, 0 if (w, h) == ("snapshot sums", "deleted") else 2) for w in WHERE for h in HOW]
CACHE_DAMAGE = ["flipped", "truncated", "garbage", "deleted"]


def _copy(pristine: Path, tmp_path: Path) -> tuple[Path, Path]:
    shutil.copytree(pristine / "store", tmp_path / "store", symlinks=True)
    shutil.copytree(pristine / "cache", tmp_path / "cache", symlinks=True)
    return tmp_path / "store", tmp_path / "cache"


@pytest.mark.parametrize("where,how,code", STORE_DAMAGE, ids=[f"{w}-{h}" for w, h, _c in STORE_DAMAGE])
def test_a_damaged_store_is_reported_and_nothing_is_lost(pristine, tmp_path, monkeypatch, capsys, where, how, code):
    root, cache = _copy(pristine, tmp_path)
    monkeypatch.setenv("PTO_STORE_READ_CACHE", str(cache))
    target = WHERE[where](root)
    good = target.read_bytes()
    HOW[how](target)
    damaged = _files(root)
    _new_process()
    got = cli.main(["--store", str(root), "replay"])
    text = capsys.readouterr()
    assert got == code, (got, text.err[-600:])
    assert "Traceback" not in text.err + text.out
    if code == 2:
        lines = [ln for ln in text.err.splitlines() if ln.startswith("error:")]
        assert lines and str(root) in text.err + text.out, text.err[-600:]
        assert cli.main(["--store", str(root), "doctor"]) == 2
        assert "Traceback" not in capsys.readouterr().err
    assert _files(root) == damaged, "a command changed the damaged store"
    target.write_bytes(good)
    _new_process()
    assert cli.main(["--store", str(root), "replay"]) == 0, "restored, the store no longer replays"


@pytest.mark.parametrize("what", ["entry", "pack"])
@pytest.mark.parametrize("how", CACHE_DAMAGE)
def test_a_damaged_read_cache_is_read_around(pristine, tmp_path, monkeypatch, capsys, what, how):
    root, cache = _copy(pristine, tmp_path)
    monkeypatch.setenv("PTO_STORE_READ_CACHE", str(cache))
    files = sorted(p for p in cache.rglob("*.npy" if what == "entry" else "*.pack") if p.is_file())
    assert files, f"no {what} in the warm cache"
    HOW[how](max(files, key=lambda p: p.stat().st_size))
    before = _files(root)
    assert cli.main(["--store", str(root), "replay"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert _files(root) == before


def _old(root: Path) -> str:
    import json

    return json.loads((root / REPO_DIR / "refs" / "tag.regen-old" / "ref.json").read_text())["snapshot"]


def _first(root: Path) -> str:
    """The repository's first snapshot: on main's history, under no tag."""
    repo = GoldenStore(root)._repo()
    return [s.id for s in repo.ancestry(branch="main")][-1]


HISTORY = {
    "old tag": lambda r: r / REPO_DIR / "refs" / "tag.regen-old" / "ref.json",
    "old tagged snapshot": lambda r: r / REPO_DIR / "snapshots" / _old(r),
    "head transaction log": lambda r: r / REPO_DIR / "transactions" / _head(r).name,
    "lock file": lambda r: r / "pto-store.lock",
    "first snapshot (untagged)": lambda r: r / REPO_DIR / "snapshots" / _first(r),
}
# (where, how, exit codes of replay / doctor / log / diff regen-old main / a record): what main's replay reads is
# intact, so it passes; doctor says DAMAGED (it said ok for a damaged tag or a deleted old snapshot), log and the
# old revision refuse naming the damage (diff said "unknown revision" for a damaged tag); a write refuses a damaged
# history. Nothing the harness runs reads icechunk's transaction logs (conflict rebase and icechunk's own diff,
# never called: writes are serialised by the lock): they damage nothing. The lock file holds only its holder's
# pid and command, rewritten by the next holder. The untagged first snapshot gone: diff of two intact revisions
# reads neither its history nor that file and passes; a record refused to write on top of the broken history
# (it committed, exit 0).
HISTORY_DAMAGE = (
    [("old tag", h, (0, 2, 2, 2, 0)) for h in HOW]
    + [("old tagged snapshot", h, (0, 2, 2, 2, 2)) for h in HOW]
    + [("head transaction log", h, (0, 0, 0, 0, 0)) for h in HOW]
    + [("lock file", h, (0, 0, 0, 0, 0)) for h in ("garbage", "deleted")]
    + [("first snapshot (untagged)", "deleted", (0, 2, 2, 0, 2))]
)
HISTORY_SAYS = {"old tag": "tag 'regen-old'", "old tagged snapshot": "snapshot", "first snapshot (untagged)": "snapshot"}


@pytest.mark.parametrize("where,how,codes", HISTORY_DAMAGE, ids=[f"{w}-{h}" for w, h, _c in HISTORY_DAMAGE])
def test_a_damaged_history_blocks_only_what_reads_it(pristine, tmp_path, monkeypatch, capsys, where, how, codes):
    root, cache = _copy(pristine, tmp_path)
    monkeypatch.setenv("PTO_STORE_READ_CACHE", str(cache))
    old = _old(root)
    target = HISTORY[where](root)
    good = target.read_bytes() if target.exists() else None
    HOW[how](target)
    damaged = _files(root)
    got = []
    for argv in (["replay"], ["doctor"], ["log"], ["diff", "regen-old", "main"],
                 ["record", "sp_slabs", "--wiring", "sharded"]):
        _new_process()
        got.append(cli.main(["--store", str(root), *argv]))
        text = capsys.readouterr()
        assert "Traceback" not in text.err + text.out, (argv, text.err[-1500:])
        if got[-1] == 2 and where in HISTORY_SAYS:
            assert HISTORY_SAYS[where] in text.err + text.out, (argv, text.err[-800:])
        if argv[0] == "doctor" and got[-1] == 2:
            assert "DAMAGED" in text.out, text.out
        if argv[0] == "record" and got[-1] == 0:
            damaged = None  # a write went ahead on an intact history: compared after the restore below
    assert tuple(got) == codes, (got, codes)
    if damaged is not None:
        assert _files(root) == damaged, "a command changed the damaged store"
    if good is not None:
        target.write_bytes(good)
    _new_process()
    assert cli.main(["--store", str(root), "replay"]) == 0 and cli.main(["--store", str(root), "log"]) == 0
    assert cli.main(["--store", str(root), "replay", "--rev", old]) == 0, "restored, the old snapshot is lost"


def test_the_suite_has_thirty_damages():
    assert len(STORE_DAMAGE) + 2 * len(CACHE_DAMAGE) + len(HISTORY_DAMAGE) >= 30
    assert {"old tag", "old tagged snapshot"} <= {w for w, _h, _c in HISTORY_DAMAGE}
