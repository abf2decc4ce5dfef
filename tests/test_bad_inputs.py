"""The project's own bad-input suite (#48 item 6, first part): bad calls of every ``goldens`` command, tried as a
new user would. Each row asserts the documented exit code (2: usage, store or file error; 3: backend or
reference error), a message naming what was wrong, no traceback, and that nothing stored changed (every file
under the store's folder byte-identical, the store still replays). The rows of tests/test_cli_errors.py (the
findings of the outside trials) count too; this file adds the breadth.
"""

from __future__ import annotations

import hashlib

import pytest

from goldens import cli, trees
from goldens.store import GoldenStore


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = GoldenStore(tmp_path_factory.mktemp("bad") / "store")
    trees.record(s, [("sp_slabs", "replicated"), ("sp_slabs", "sharded"), ("rope_rows", "replicated")], seed=3)
    return s


def _files(root) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


NOWHERE = "/nonexistent/pto-bad-input"
# (argv after --store STORE ({T}: a fresh folder outside the store), exit code, text the message must hold)
BAD = [
    # record
    (["record", "no_such_case"], 2, "no_such_case"),
    (["record", "sp_slabs", "--wiring", "diagonal"], 2, "diagonal"),
    (["record", "--seed", "-1", "sp_slabs"], 2, "seed"),
    (["record", "--seed", "x", "sp_slabs"], 2, "seed"),
    (["record", "--geometry", "no-such-geometry", "sp_slabs"], 2, "no-such-geometry"),
    (["record", "../escape"], 2, "../escape"),
    (["record", "sp_slabs/replicated"], 2, "sp_slabs/replicated"),
    # replay
    (["replay", "no_such_case"], 2, "no_such_case"),
    (["replay", "--wiring", "diagonal", "sp_slabs"], 2, "diagonal"),
    (["replay", "--rev", "no-such-tag", "sp_slabs"], 2, "no-such-tag"),
    (["replay", "--rev", "ZZZZZZZZZZZZZZZZZZZZ", "sp_slabs"], 2, "ZZZZZZZZZZZZZZZZZZZZ"),
    (["replay", "--backend", "no_such_backend", "sp_slabs"], 2, "no_such_backend"),
    (["replay", "--backend-module", "no_such_module:X", "sp_slabs"], 2, "no_such_module"),
    (["replay", "--backend-module", "json:no_such_attr", "sp_slabs"], 2, "no_such_attr"),
    (["replay", "--backend-module", "json", "sp_slabs"], 2, "json"),
    (["replay", "--backend-module", ":X", "sp_slabs"], 2, ":X"),
    (["replay", "--backend-module", f"{NOWHERE}.py:X", "sp_slabs"], 2, "no file"),
    (["replay", "--backend-module", "json:dumps", "sp_slabs"], 2, "dumps"),
    (["replay", "--backend-module", "math:pi", "sp_slabs"], 2, "pi"),
    (["replay", "--operator", "no_such_operator"], 2, "no_such_operator"),
    (["replay", "--junit", "/proc/nope/x.xml", "sp_slabs"], 2, "--junit /proc/nope/x.xml"),
    (["replay", "--json", "--junit", "/dev/full", "sp_slabs"], 2, "/dev/full"),
    (["replay", "--report", "/proc/nope", "sp_slabs"], 2, "/proc/nope"),
    (["replay", "../escape"], 2, "../escape"),
    # report
    (["report", "--out", "/proc/nope", "sp_slabs"], 2, "/proc/nope"),
    (["report", "--out", "/dev/full", "sp_slabs"], 2, "/dev/full"),
    (["report", "no_such_case"], 2, "no_such_case"),
    # regen
    (["regen", "no_such_case"], 2, "no_such_case"),
    (["regen", "--wiring", "diagonal", "sp_slabs"], 2, "diagonal"),
    (["regen", "../escape"], 2, "../escape"),
    # log / diff / show
    (["log", "--limit", "0"], 2, "limit"),
    (["log", "--limit", "x"], 2, "limit"),
    (["diff", "no-such-rev", "main"], 2, "no-such-rev"),
    (["diff", "main", "no-such-rev"], 2, "no-such-rev"),
    (["show", "no_such_case"], 2, "no_such_case"),
    (["show", "--rev", "no-such-rev", "sp_slabs"], 2, "no-such-rev"),
    # gc / du
    (["gc", "--older-than-days", "-1"], 2, "older-than-days"),
    (["gc", "--older-than-days", "nan"], 2, "older-than-days"),
    (["gc", "--keep-last", "-3"], 2, "keep-last"),
    (["gc", "--keep-regen-tags", "x"], 2, "keep-regen-tags"),
    (["du", "no_such_case"], 2, "no_such_case"),
    # export-pt / import-pt / import-kept
    (["export-pt", "no_such_case", "{T}/out"], 2, "no_such_case"),
    (["export-pt", "sp_slabs", "{T}/out", "--rev", "no-such-rev"], 2, "no-such-rev"),
    (["export-pt", "sp_slabs", "/proc/nope"], 2, "/proc/nope"),
    (["export-pt", "sp_slabs", "/dev/null"], 2, "/dev/null"),
    (["import-pt", NOWHERE, "--case", "sp_slabs"], 2, NOWHERE),
    (["import-pt", "{T}", "--case", "no_such_case"], 2, "no_such_case"),
    (["import-pt", "{T}", "--case", "sp_slabs"], 2, "{T}"),
    (["import-kept", "sp_slabs"], 2, "--from"),
    (["import-kept", "--from", NOWHERE, "sp_slabs"], 2, "--cases-module"),
    (["--cases-module", "goldens.cases.pro", "import-kept", "--from", NOWHERE, "sp_slabs"], 2, NOWHERE),
    # the store itself
    (["--store", NOWHERE, "replay"], 2, NOWHERE),
    (["--store", "/dev/null", "replay"], 2, "/dev/null"),
    (["--store", "s3://", "replay"], 2, "s3://"),
    (["--store", "", "replay"], 2, "store"),
    (["--cases-module", "no_such_module", "replay"], 2, "no_such_module"),
    (["--cases-module", f"{NOWHERE}.py", "replay"], 2, "no file"),
]


def _argv(store, row, tmp):
    argv = [a.replace("{T}", str(tmp)) for a in row]
    return argv if argv[0] == "--store" else ["--store", str(store.root), *argv]


@pytest.mark.parametrize("argv,code,names", BAD, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_bad_input_changes_nothing_and_says_what(store, tmp_path, capsys, argv, code, names):
    before = _files(store.root)
    try:
        got = cli.main(_argv(store, argv, tmp_path))
    except SystemExit as exc:  # argparse's own usage errors (exit 2, a usage line and the error line)
        got = exc.code
    out = capsys.readouterr()
    text = out.err + out.out
    assert got == code, (got, text[-800:])
    assert names.replace("{T}", str(tmp_path)) in text, text[-800:]
    assert "Traceback" not in text, text[-2000:]
    assert _files(store.root) == before, "something stored changed"


def test_the_table_is_broad():
    assert len(BAD) >= 50 and len({row[0][0] if row[0][0] != "--store" else row[0][2] for row in BAD}) >= 12
