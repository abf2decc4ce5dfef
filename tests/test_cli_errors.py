"""Bad input, a fault or a crash gets one line naming what and where, the documented exit code (1 out of bound,
2 usage or store, 3 backend or reference error), never a traceback. One row per bad call (issue: goldens a
kernel engineer trusts through a change)."""

from __future__ import annotations

import pytest

from contracts import compare
from goldens import cli, trees
from goldens import replay as replay_cmd
from goldens.store import GoldenStore
from goldens.store_format import REPO_DIR

# (argv after --store, exit code, a fragment of the one error line)
BAD_CALLS = [
    (["log", "--limit", "-5"], 2, "expected a positive integer"),
    (["record", "--seed", "99999999999999999999", "sp_slabs"], 2, "a seed is in [0, 2^62)"),
    (["show", "../x"], 2, "case name '../x'"),
    (["replay", "../x"], 2, "case name '../x'"),
    (["regen", "../x"], 2, "case name '../x'"),
    (["export-pt", "../x", "out"], 2, "case name '../x'"),
    (["replay", "--backend-module", "os:system", "sp_slabs"], 2, "system is a builtin, not a Backend"),
    # #48: a backend module names a backend, checked before anything is called (sys:exit was a green run)
    (["replay", "--backend-module", "sys:exit", "sp_slabs"], 2, "exit is a builtin, not a Backend"),
    (["replay", "--backend-module", "builtins:exit", "sp_slabs"], 2, "exit is Quitter, not a Backend"),
    (["replay", "--backend-module", "os:abort", "sp_slabs"], 2, "abort is a builtin, not a Backend"),
    (["replay", "--backend-module", "goldens.cli:main", "sp_slabs"], 2, "main is annotated to return int"),
    (["replay", "--backend-module", "goldens.trees:load_tree", "sp_slabs"], 2, "load_tree is annotated to return"),
    (["replay", "--backend-module", "shutil:rmtree", "sp_slabs"], 2, "rmtree needs argument(s) path"),
    # #48: the tracebacks
    (["replay", "--backend-module", "/etc/passwd:X", "sp_slabs"], 2, "/etc/passwd is not a Python file"),
    # #48: messages that misled
    (["replay", "--backend-module", "a:b:c", "sp_slabs"], 2, "--backend-module 'a:b:c'"),  # was 'a🅱c'
    (["replay", "--junit", "/dev/full", "sp_slabs"], 2, "--junit /dev/full: cannot write it (No space left"),
    (["--cases-module", "os", "replay", "sp_slabs"], 2, "cases module 'os' registers no case"),
]


@pytest.fixture
def store(tmp_path):
    s = GoldenStore(tmp_path / "store")
    trees.record(s, [("sp_slabs", "replicated"), ("rope_rows", "replicated")], seed=3)
    return s


@pytest.mark.parametrize("argv,code,fragment", BAD_CALLS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_bad_call_is_one_line_with_its_exit_code(store, capsys, argv, code, fragment):
    with pytest.raises(SystemExit) if code == 2 and argv[0] in ("log", "record") else _no_raise() as caught:
        got = cli.main(["--store", str(store.root), *argv])
    if caught is not None and isinstance(getattr(caught, "value", None), SystemExit):
        got = caught.value.code
    err = capsys.readouterr().err
    assert got == code and fragment in err and "Traceback" not in err, (got, err)


class _no_raise:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_a_tree_naming_an_unknown_comparator_is_a_store_error(store, capsys):
    from dataclasses import replace

    from goldens.catalog import TreeRecord

    path = "sp_slabs/replicated"  # a tree written by a version with a comparator this one does not have
    rec = TreeRecord.from_attrs(store.reader().group_attrs(path), where=path)
    rec = replace(rec, comparators={k: "no_such_comparator" for k in rec.comparators})
    store.commit({}, {path: rec.to_attrs()}, "a comparator renamed since")
    assert cli.main(["--store", str(store.root), "replay", "sp_slabs"]) == 2
    err = capsys.readouterr().err
    assert "names comparator(s) ['no_such_comparator']" in err and "Traceback" not in err, err


def test_a_comparator_that_raises_is_an_error_row_and_the_others_still_run(store, capsys, monkeypatch):
    def broken(name, a, e, ctx):
        raise KeyError("seq")

    monkeypatch.setitem(compare.COMPARATORS, "exact", broken)
    assert cli.main(["--store", str(store.root), "replay", "--json"]) == 3
    out = capsys.readouterr().out
    assert "a comparator raised judging it" in out and "KeyError" in out, out[-2000:]


def test_ctrl_c_stops_after_the_tree_in_hand_with_the_rows_so_far(store, capsys, monkeypatch):
    real = trees.replay

    def replay_then_ctrl_c(*args, **kwargs):
        replay_cmd._INTERRUPTED.set()  # what the first SIGINT does (goldens.replay._on_sigint)
        return real(*args, **kwargs)

    monkeypatch.setattr(trees, "replay", replay_then_ctrl_c)
    assert cli.main(["--store", str(store.root), "replay"]) == 130
    captured = capsys.readouterr()
    assert "interrupted (Ctrl-C) after 1 of 2 tree(s)" in captured.err and "rope_rows" in captured.out


def _exported(store, tmp_path, case="sp_slabs"):
    out = tmp_path / "pt"
    assert cli.main(["--store", str(store.root), "export-pt", case, str(out), "--wiring", "replicated"]) == 0
    return out


def test_import_pt_refuses_a_tree_the_replay_could_not_take_and_writes_nothing(store, tmp_path, capsys):
    """A 1-dim tensor where the operator takes a 0-dim scalar (tp.pt = tensor([4])), and an output's file under
    in/: refused naming the file, exit 2, nothing committed (the replay would have refused the tree)."""
    import shutil

    import torch

    out = _exported(store, tmp_path)
    before = [e.snapshot for e in store.log()]
    scalar = next(p for p in (out / "replicated" / "in").glob("*.pt") if torch.load(p, weights_only=True).ndim == 0)
    torch.save(torch.load(scalar, weights_only=True).reshape(1), scalar)
    capsys.readouterr()
    assert cli.main(["--store", str(store.root), "import-pt", str(out), "--case", "sp_slabs"]) == 2
    err = capsys.readouterr().err
    assert f"{scalar.stem}.pt: the operator" in err and "0-dim scalar" in err and "nothing was imported" in err and "of shape [1]" in err, err
    out2 = _exported(store, tmp_path / "b")
    moved = next((out2 / "replicated" / "out").glob("*.pt"))
    shutil.copy(moved, out2 / "replicated" / "in" / moved.name)
    assert cli.main(["--store", str(store.root), "import-pt", str(out2), "--case", "sp_slabs"]) == 2
    assert "are not inputs of operator" in capsys.readouterr().err
    assert [e.snapshot for e in store.log()] == before


def test_import_pt_warns_when_an_expected_output_is_not_the_references(store, tmp_path, capsys):
    """Imported expected outputs are judged against what the reference computes for the imported inputs: the
    same bytes say nothing; one unit off is imported with a 'within the comparators' warning; far off is imported
    with a warning that the reference replay will fail it (and it does)."""
    import torch

    out = _exported(store, tmp_path, "rope_rows")
    target = out / "replicated" / "out" / "rope_cos.pt"
    good = torch.load(target, weights_only=True)
    fresh = tmp_path / "fresh"
    capsys.readouterr()
    assert cli.main(["--store", str(fresh), "import-pt", str(out), "--case", "rope_rows"]) == 0
    assert "warning" not in capsys.readouterr().err
    bits = {2: torch.int16, 4: torch.int32}[good.element_size()]
    unit = good.clone()
    unit.view(bits).reshape(-1)[5] += 1  # the neighbouring value of the format
    torch.save(unit, target)
    assert cli.main(["--store", str(fresh), "import-pt", str(out), "--case", "rope_rows"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "not the reference's for these inputs, but within the tree's comparators" in err, err
    far = good.clone()
    far.reshape(-1)[5] = far.reshape(-1)[5] * 4 + 1
    torch.save(far, target)
    assert cli.main(["--store", str(fresh), "import-pt", str(out), "--case", "rope_rows"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "PAST the tree's comparators" in err and "rope_cos" in err and "will fail" in err, err
    assert cli.main(["--store", str(fresh), "replay", "rope_rows"]) == 1  # as the warning said


def test_one_unreadable_tree_does_not_block_the_others(store, capsys):
    """A tree whose record fails its checksum is an ERROR row; every other tree is still replayed; exit 2."""
    path = "sp_slabs/replicated"
    attrs = dict(store.reader().group_attrs(path))
    attrs["seed"] = 12345  # changed outside goldens: the record's checksum no longer matches
    store.commit({}, {path: attrs}, "tampered")
    assert cli.main(["--store", str(store.root), "replay", "--json"]) == 2
    rows = __import__("json").loads(capsys.readouterr().out)["rows"]
    verdicts = {(r["case"], r["verdict"]) for r in rows}
    assert ("sp_slabs", "ERROR") in verdicts and ("rope_rows", "PASS") in verdicts, verdicts
    assert cli.main(["--store", str(store.root), "doctor"]) == 2  # the store is there: DAMAGED, never MISSING
    out = capsys.readouterr().out
    assert "DAMAGED" in out and "1 of 2 cannot be read" in out, out[-1500:]


def test_doctor_reads_the_store_itself_not_the_read_cache(store, capsys):
    """Chunks damaged after a replay has filled the read cache: a replay may still be served from the cache,
    but doctor reads the store's own chunks and says DAMAGED (exit 2)."""
    assert cli.main(["--store", str(store.root), "replay"]) == 0  # fills the read cache (packs)
    assert list(store.read_cache.rglob("*.pack"))
    for f in (store.root / REPO_DIR / "chunks").rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    capsys.readouterr()
    assert cli.main(["--store", str(store.root), "doctor"]) == 2
    out = capsys.readouterr().out
    assert "DAMAGED" in out and "of 2 cannot be read" in out, out[-1500:]


def test_a_commit_whose_tag_cannot_be_written_is_committed_and_said_so(store, monkeypatch):
    """The commit lands, its tag (regen-<time>) does not (permission denied; on S3 a dropped connection): the
    result says the store is fine and the snapshot is on main (goldens regen prints it as a warning, exit 0),
    never 'damaged, restore from a backup'; the next write restores the tag from the snapshot's metadata."""
    from goldens.store import GoldenStore as Store

    real = Store._create_tag

    def denied(repo, name, snapshot):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Store, "_create_tag", staticmethod(denied))
    before = len(store.log())
    result = store.commit({}, {"notes": {"why": "a regen"}}, "regen notes", metadata={"action": "regen"},
                          tag="regen-20261202T000000000000Z")
    assert result.snapshot and "is on main, but its tag regen-20261202T000000000000Z" in result.tag_error
    assert "store is fine" in result.tag_error and len(store.log()) == before + 1
    assert not any(t.startswith("regen-") for e in store.log() for t in e.tags)
    monkeypatch.setattr(Store, "_create_tag", staticmethod(real))
    trees.record(store, [("cache_index", "replicated")], seed=4)  # the next write
    assert any(t == "regen-20261202T000000000000Z" for e in store.log() for t in e.tags)


def test_evidence_names_the_worst_element_and_says_when_signs_differ():
    """check_moe_rows' quota failure shows the element with the largest relative difference (not the first over
    the threshold); a mismatch across zero says 'opposite signs' instead of a step count in the billions."""
    import torch

    from contracts.checks.moe import check_moe_rows
    from contracts.evidence import mismatches
    from contracts.tolerances import RELDIFF_THD

    e = torch.ones(4, 64, dtype=torch.float32)
    a = e.clone()
    a[0, :8] *= 1 + 2 * RELDIFF_THD  # over the threshold, first (8 of 256: past the 2 % quota)
    a[2, 5] *= 1 + 20 * RELDIFF_THD  # the worst
    r = check_moe_rows(a, e, 4)
    assert not r.ok and r.worst.index == (2, 5), r.message()
    (m,) = mismatches(torch.tensor([-1.0]), torch.tensor([1.0]))
    assert m.ulps is None and "opposite signs" in m.describe(), m.describe()


def test_log_names_a_damaged_tag_instead_of_hiding_it(store, capsys):
    """A tag whose ref cannot be read is left out of icechunk's tag list: goldens log says so (exit 2) rather
    than showing a history without it; gc refuses to run (its snapshot would lose the tag's protection)."""
    snapshot = store.log()[0].snapshot
    store.tag("keep-me", snapshot)
    (store.root / "icechunk" / "refs" / "tag.keep-me" / "ref.json").write_text("garbage{")
    assert cli.main(["--store", str(store.root), "log"]) == 2
    err = capsys.readouterr().err
    assert "tag 'keep-me' cannot be read" in err and "not protected from gc" in err and "Traceback" not in err, err
    assert cli.main(["--store", str(store.root), "gc", "--older-than-days", "0"]) == 2
    assert "gc refused: tag 'keep-me'" in capsys.readouterr().err


def _snapshot_files(root) -> dict:
    """Every file under a store's folder with its bytes' digest: what 'nothing changed' is checked against."""
    import hashlib

    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# (argv after --store STORE, with {S} for the store's folder; what the one line names) -- #48 item 2: no output
# lands inside a store. Each was exit 0 and wrote into the store before.
INTO_THE_STORE = [
    (["--store", "{S}/icechunk/refs", "record", "sp_slabs"], "a store cannot be created inside another"),
    (["--store", "{S}", "report", "--out", "{S}/icechunk/refs", "sp_slabs"], "--out"),
    (["--store", "{S}", "replay", "--junit", "{S}/icechunk/x.xml", "sp_slabs"], "--junit"),
    (["--store", "{S}", "replay", "--report", "{S}/rep", "sp_slabs"], "--report"),
    (["--store", "{S}", "export-pt", "sp_slabs", "{S}"], "export-pt DIR"),
    (["--store", "{S}", "export-pt", "sp_slabs", "{S}/in"], "export-pt DIR"),
    (["--store", "{S}", "replay", "--junit", "{S}", "sp_slabs"], "--junit"),
]


@pytest.mark.parametrize("argv,names", INTO_THE_STORE, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_no_command_writes_inside_a_store(store, capsys, argv, names):
    root = store.root
    before = _snapshot_files(root)
    got = cli.main([a.replace("{S}", str(root)) for a in argv])
    err = capsys.readouterr().err
    assert got == 2 and names in err and f"inside the golden store {root.resolve()}" in err, (got, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert _snapshot_files(root) == before, "the store's folder changed"
    assert cli.main(["--store", str(root), "replay"]) == 0, "the store no longer replays"


def test_pytest_refuses_a_golden_report_inside_a_store(store, tmp_path):
    """pytest --golden-report STORE/rep: a usage error (exit 4), one line, before any test; nothing written."""
    import subprocess
    import sys

    before = _snapshot_files(store.root)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "contracts/test_slabs.py",
                           "--golden-store", str(store.root), "--golden-report", str(store.root / "rep")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4 and "--golden-report" in proc.stderr and "inside the golden store" in proc.stderr, \
        (proc.returncode, proc.stderr[-500:])
    assert _snapshot_files(store.root) == before


def test_pytest_refuses_a_backend_module_that_is_not_a_backend():
    """pytest --backend-module sys:exit: a usage error (exit 4), named, nothing called (it was a green run)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "contracts/test_slabs.py",
                           "--backend-module", "sys:exit"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4 and "exit is a builtin, not a Backend" in proc.stderr, (proc.returncode,
                                                                                       proc.stderr[-500:])


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_damaged_chunk_under_a_warm_read_cache_is_reported(tmp_path, monkeypatch, capsys, damage):
    """#48 item 1: v4_prefill_indexer's tree replayed twice (the read cache and its pack warm), then its largest
    chunk file damaged in the store: the replay reads the store's chunk bytes before serving any cached copy, so
    it exits 2 naming the array (it exited 0 with PASS from the cache), and doctor says DAMAGED; the chunk
    restored, the replay passes again (nothing lost)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "store"
    assert cli.main(["--store", str(root), "record", "v4_prefill_indexer"]) == 0
    for _ in range(2):
        assert cli.main(["--store", str(root), "replay", "v4_prefill_indexer"]) == 0
    assert list((tmp_path / "cache").rglob("*.npy")) and list((tmp_path / "cache").rglob("*.pack")), "cache cold"
    chunk = max((root / "icechunk" / "chunks").iterdir(), key=lambda p: p.stat().st_size)
    good = chunk.read_bytes()
    bad = bytearray(good)
    if damage == "truncated":
        bad = bad[: len(bad) // 2]
    else:
        bad[len(bad) // 2] ^= 0xFF
    chunk.write_bytes(bytes(bad))
    capsys.readouterr()
    assert cli.main(["--store", str(root), "replay", "v4_prefill_indexer"]) == 2
    err = capsys.readouterr().err
    assert "v4_prefill_indexer/replicated" in err and "Traceback" not in err, err
    assert cli.main(["--store", str(root), "doctor"]) == 2
    assert "DAMAGED" in capsys.readouterr().out
    chunk.write_bytes(good)
    assert cli.main(["--store", str(root), "replay", "v4_prefill_indexer"]) == 0


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf"])
def test_a_bad_lock_timeout_is_one_line(store, capsys, monkeypatch, value):
    """PTO_STORE_LOCK_TIMEOUT that is not a finite number of seconds >= 0: exit 2 naming it (a ValueError
    traceback before), nothing committed."""
    monkeypatch.setenv("PTO_STORE_LOCK_TIMEOUT", value)
    before = [e.snapshot for e in store.log()]
    assert cli.main(["--store", str(store.root), "record", "cache_index"]) == 2
    err = capsys.readouterr().err
    assert f"PTO_STORE_LOCK_TIMEOUT={value!r}" in err and "Traceback" not in err, err
    assert [e.snapshot for e in store.log()] == before


def test_pytest_refuses_a_golden_report_it_cannot_write(tmp_path):
    """pytest --golden-report /proc/nope: one usage error before any test (a FileNotFoundError in every golden
    test before)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "contracts/test_slabs.py",
                           "--golden-report", "/proc/nope"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4 and "--golden-report /proc/nope: cannot write there" in proc.stderr, \
        (proc.returncode, proc.stderr[-500:])


def test_pytest_checks_the_pypto_lib_path_before_any_test(tmp_path):
    """pytest --backend upstream --pypto-lib with no checkout there: a usage error at once (exit 4), not NOTHING RAN
    after every other test (45-53 s before)."""
    import subprocess
    import sys

    for lib, words in ((tmp_path / "nope", "no such folder"), (tmp_path, "no models/ in it")):
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "contracts/",
                               "--backend", "upstream", "--pypto-lib", str(lib)], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 4 and f"--pypto-lib {lib}: {words}" in proc.stderr, (proc.returncode,
                                                                                       proc.stderr[-500:])


def _reference_raises_on_rope_rows(monkeypatch) -> None:
    """The current reference raises while describing rope_rows' tree (as a reference edit that broke it would)."""
    real = trees._spec_probe

    def raising(case, wiring):
        if case.name == "rope_rows":
            raise RuntimeError("a reference edit broke it")
        return real(case, wiring)

    monkeypatch.setattr(trees, "_spec_probe", raising)


def test_doctor_tells_a_raising_reference_from_a_damaged_store(store, capsys, monkeypatch):
    """#48 item 5: a current reference that raises on a tree (and changed since it was recorded): doctor says
    the tree is readable, the reference raises (exit 3, as replay does) and the tree is stale -- it said
    "DAMAGED readable trees ... exit 2" and "none stale"."""
    _reference_raises_on_rope_rows(monkeypatch)
    monkeypatch.setattr(trees, "staleness", lambda reader, c, w: ("reference changed",) if c == "rope_rows" else ())
    capsys.readouterr()
    assert cli.main(["--store", str(store.root), "doctor"]) == 3
    out = capsys.readouterr().out
    assert "current reference" in out and "raises on 1 of" in out and "DAMAGED" not in out, out
    assert "1 stale (rope_rows/replicated" in out, out
    assert cli.main(["--store", str(store.root), "replay", "rope_rows"]) == 3


def test_doctor_calls_an_unreadable_store_damaged_not_missing(store, capsys):
    """#48 item 5: a store whose branch ref is damaged is DAMAGED golden store (exit 2), never MISSING."""
    refs = store.root / REPO_DIR / "refs"
    ref = next(p for p in refs.rglob("*") if p.is_file())
    ref.write_bytes(b"\x00garbage")
    capsys.readouterr()
    assert cli.main(["--store", str(store.root), "doctor"]) == 2
    out = capsys.readouterr().out
    assert "DAMAGED" in out and "MISSING │ golden store" not in out.replace("  ", " "), out


def test_verbose_shows_the_traceback_of_a_reference_that_raises(store, capsys, monkeypatch):
    """#48: a reference that raises while describing a tree: replay exits 3 with its one line, and --verbose adds
    the traceback the closing line promises (it printed none)."""
    _reference_raises_on_rope_rows(monkeypatch)
    capsys.readouterr()
    assert cli.main(["--store", str(store.root), "replay", "rope_rows"]) == 3
    quiet = capsys.readouterr()
    assert "Traceback" not in quiet.out + quiet.err and "a reference edit broke it" in quiet.out + quiet.err
    assert cli.main(["--store", str(store.root), "replay", "--verbose", "rope_rows"]) == 3
    loud = capsys.readouterr()
    assert "Traceback (most recent call last)" in loud.out and "RuntimeError: a reference edit broke it" in loud.out


def test_a_damaged_old_tagged_snapshot_does_not_block_replaying_main(store, capsys):
    """#48 item 5: an older snapshot (tagged) whose file is damaged: replaying main still passes; a write, and a
    replay of that tag, refuse naming the snapshot (exit 2); doctor reports the damaged history (exit 2) -- every
    command refused before, a replay of main included. The file restored, everything passes."""
    from goldens.store_format import REPO_DIR

    assert cli.main(["--store", str(store.root), "record", "cache_index"]) == 0
    repo = store._repo()
    old = [a.id for a in repo.ancestry(branch="main")][1]
    repo.create_tag("regen-old", old)
    snap = store.root / REPO_DIR / "snapshots" / old
    good = snap.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    snap.write_bytes(bytes(bad))
    capsys.readouterr()
    assert cli.main(["--store", str(store.root), "replay"]) == 0
    for argv in (["record", "rope_rows"], ["replay", "--rev", "regen-old"]):
        assert cli.main(["--store", str(store.root), *argv]) == 2, argv
        err = capsys.readouterr().err
        assert f"snapshot {old}" in err and "Traceback" not in err, (argv, err)
    assert cli.main(["--store", str(store.root), "doctor"]) == 2
    assert "snapshot history" in capsys.readouterr().out
    snap.write_bytes(good)
    assert cli.main(["--store", str(store.root), "replay", "--rev", "regen-old"]) == 0


def test_a_crash_of_goldens_itself_is_one_line_exit_3(store, capsys, monkeypatch):
    """#48: `goldens report` once ended in a SystemError traceback (exit 1, the out-of-bound code). Anything
    unexpected is now one line -- type, message, the innermost frame of the project's code -- exit 3 (README),
    nothing committed; PTO_DEBUG=1 lets the traceback through."""
    from goldens import fingerprint

    def broken(source):
        raise SystemError("AST constructor recursion depth mismatch (before=48, after=47)")

    monkeypatch.setattr(fingerprint, "_parse", broken)
    monkeypatch.setattr(fingerprint, "_CODE", {})
    before = [e.snapshot for e in store.log()]
    got = cli.main(["--store", str(store.root), "report", "--out", str(store.root.parent / "rep"), "sp_slabs"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert got == 3 and len(lines) == 1 and "Traceback" not in err, (got, err)
    assert "internal error: SystemError: AST constructor recursion depth mismatch" in err, err
    assert "(at tests/test_cli_errors.py:" in err and "PTO_DEBUG=1" in err, err  # the innermost frame: broken
    assert [e.snapshot for e in store.log()] == before
    monkeypatch.setenv("PTO_DEBUG", "1")
    with pytest.raises(SystemError):
        cli.main(["--store", str(store.root), "report", "--out", str(store.root.parent / "rep"), "sp_slabs"])


def test_cpythons_spurious_ast_depth_error_is_parsed_again(monkeypatch):
    """python/cpython#106905 (3.11): ast.parse may raise a spurious "recursion depth mismatch" SystemError; the
    fingerprint parses once more, and raises a second failure or any other SystemError."""
    import ast

    from goldens import fingerprint

    real, calls = ast.parse, []

    def flaky(source, *a, **k):
        calls.append(source)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=3, after=2)")
        return real(source, *a, **k)

    from types import SimpleNamespace

    monkeypatch.setattr(fingerprint, "ast", SimpleNamespace(parse=flaky))  # (pytest's own reports use ast.parse)
    assert isinstance(fingerprint._parse("x = 1\n"), ast.Module) and len(calls) == 2
    others = []

    def other(source):
        others.append(source)
        raise SystemError("other")

    monkeypatch.setattr(fingerprint, "ast", SimpleNamespace(parse=other))
    with pytest.raises(SystemError, match="other"):
        fingerprint._parse("x = 1\n")
    assert len(others) == 1, "another SystemError is not a reason to parse again"
