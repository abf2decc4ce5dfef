"""Bad input, a fault or a crash gets one line naming what and where, the documented exit code (1 out of bound,
2 usage or store, 3 backend or reference error), never a traceback. One row per bad call (issue: goldens a
kernel engineer trusts through a change)."""

from __future__ import annotations

import pytest

from contracts import compare
from goldens import cli, trees
from goldens.store import GoldenStore

# (argv after --store, exit code, a fragment of the one error line)
BAD_CALLS = [
    (["log", "--limit", "-5"], 2, "expected a positive integer"),
    (["record", "--seed", "99999999999999999999", "sp_slabs"], 2, "a seed is in [0, 2^62)"),
    (["show", "../x"], 2, "case name '../x'"),
    (["replay", "../x"], 2, "case name '../x'"),
    (["regen", "../x"], 2, "case name '../x'"),
    (["export-pt", "../x", "out"], 2, "case name '../x'"),
    (["replay", "--backend-module", "os:system", "sp_slabs"], 2, "calling system raised TypeError"),
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
        cli._INTERRUPTED.set()  # what the first SIGINT does (cli._on_sigint)
        return real(*args, **kwargs)

    monkeypatch.setattr(trees, "replay", replay_then_ctrl_c)
    assert cli.main(["--store", str(store.root), "replay"]) == 130
    captured = capsys.readouterr()
    assert "interrupted (Ctrl-C) after 1 of 2 tree(s)" in captured.err and "rope_rows" in captured.out
