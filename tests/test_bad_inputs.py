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


# pytest's options (#48 item 6): each a usage error at start-up, exit 4, one "ERROR:" line naming what was wrong,
# before any test, nothing written. {S}: a store (its files must not change), {T}: a fresh folder, {F}: a file.
BAD_PYTEST = [
    (["--golden-store", NOWHERE], "--golden-store /nonexistent/pto-bad-input: no golden store there (no such folder"),
    (["--golden-store", "{F}"], "no golden store there (a file"),
    (["--golden-store", "s3://"], "--golden-store"),
    (["--golden-store", ""], "--golden-store"),
    (["--backend", "upstream", "--pypto-lib", NOWHERE], f"--pypto-lib {NOWHERE}: no such folder"),
    (["--backend", "upstream", "--pypto-lib", "{T}"], "no models/ in it"),
    (["--golden-report", "/proc/nope"], "--golden-report /proc/nope: cannot write there"),
    (["--golden-report", "{F}"], "--golden-report"),
    (["--golden-report", "{S}/rep"], "inside the golden store"),
    (["--golden-report", "{S}/icechunk/refs"], "inside the golden store"),
    (["--junit-xml", "{S}/x.xml"], "--junit-xml"),
    (["--golden-cases", "no_such_module"], "no_such_module"),
    (["--golden-cases", "os"], "registers no case"),
    (["--golden-cases", f"{NOWHERE}.py"], "no file"),
    (["--backend", "no_such_backend"], "no_such_backend"),
    (["--backend-module", "sys:exit"], "exit is a builtin, not a Backend"),
    (["--backend-module", "json:dumps"], "dumps"),
    (["--backend-module", "/etc/passwd:X"], "/etc/passwd is not a Python file"),
    (["--backend-module", "no_such_module:X"], "no_such_module"),
    (["--operator", "no_such_operator"], "no_such_operator"),
    (["--devices", "x"], "--devices 'x'"),
    (["--devices", "0-1"], "2 device(s) need -n 2 (one xdist worker per device), got no -n"),
    (["--devices", "0-1", "--device", "0"], "not both"),
    (["--tp", "3"], "deployment.tp: expected one of (1, 2, 4, 8), got 3"),
    (["--dp", "0"], "deployment.dp"),
    (["--ep", "5"], "deployment.ep"),
    (["--tp", "x"], "argument --tp"),
    (["--platform", "a9"], "argument --platform"),
    (["--model", "no_such_model"], "argument --model"),
]

_DRIVER = r"""
import contextlib, io, json, sys
import pytest
rows = json.loads(sys.argv[1])
out = []
for argv in rows:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as std:
        code = pytest.main(["-q", "-p", "no:cacheprovider", "contracts/test_slabs.py", *argv])
    out.append({"code": int(code), "err": err.getvalue(), "out": std.getvalue()})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def pytest_runs(store, tmp_path_factory):
    """Every BAD_PYTEST row run through pytest.main in one child process (each row in-process there: the plugin
    keeps session state in module globals, never shared with this session's)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    tmp = tmp_path_factory.mktemp("badpytest")
    (tmp / "a-file").write_text("not a folder\n")
    rows = [[a.replace("{S}", str(store.root)).replace("{T}", str(tmp / "empty")).replace("{F}", str(tmp / "a-file"))
             for a in argv] for argv, _ in BAD_PYTEST]
    (tmp / "empty").mkdir()
    before = _files(store.root)
    proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(rows)], cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1]), before, tmp


@pytest.mark.parametrize("i", range(len(BAD_PYTEST)), ids=[" ".join(a) for a, _ in BAD_PYTEST])
def test_a_bad_pytest_option_is_one_usage_error_before_any_test(pytest_runs, store, i):
    runs, before, tmp = pytest_runs
    got, (_argv, names) = runs[i], BAD_PYTEST[i]
    errors = [line for line in got["err"].splitlines() if line.startswith("ERROR:")]
    assert got["code"] == 4 and len(errors) == 1, (got["code"], got["err"][-1500:])
    assert names in got["err"], got["err"][-1500:]
    assert "Traceback" not in got["err"] + got["out"] and " passed" not in got["out"], got["err"][-1500:]
    assert _files(store.root) == before, "something stored changed"
    assert sorted(p.name for p in tmp.iterdir()) == ["a-file", "empty"] and not any((tmp / "empty").iterdir())


def test_the_pytest_table_is_broad():
    assert len(BAD_PYTEST) >= 25 and len({argv[0] for argv, _ in BAD_PYTEST}) >= 12
