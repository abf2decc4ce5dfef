"""The commands the docs show work as written, from the repository root (issue #24 item 6).

Every ``goldens`` command line of the code blocks of README.md, docs/guide.md and docs/reference.md and of the ``docs/examples`` docstrings is parsed by
the real argument parser (a renamed or removed option fails here, not in a user's shell). The example files'
commands, and the README's commands that need nothing but this repository, are run exactly as written through
the installed ``goldens`` script (which, unlike ``python -m``, does not put the working directory on sys.path),
against a copy of the sample store; only ``out/`` paths are moved under a temporary folder.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from goldens.cli import build_parser
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GLOBAL = {"--store", "--cases-module"}  # options of `goldens` itself, given before the verb


DOCS = ("README.md", "docs/guide.md", "docs/reference.md")  # the docs that show `goldens` commands


def _readme_commands() -> list[str]:
    out = []
    for doc in DOCS:
        inside = False
        for line in (ROOT / doc).read_text().splitlines():
            if line.startswith("```"):
                inside = not inside
                continue
            if inside:
                for part in line.split(";"):  # "goldens log; goldens diff A B"
                    command = part.split(" #")[0].strip()
                    if command.startswith((".venv/bin/goldens ", "goldens ")):
                        out.append(command)
    return out


def _example_commands() -> list[tuple[str, str]]:
    out = []
    for path in sorted((ROOT / "docs" / "examples").glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        for line in doc.splitlines():
            command = line.strip()
            if command.startswith(("goldens ", "pytest ")):
                out.append((path.name, command))
    return out


def _argv(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[0].endswith("goldens"), command
    return words[1:]


README = _readme_commands()
EXAMPLES = _example_commands()


def test_the_docs_show_commands_at_all():
    assert len(README) >= 20 and any(c.startswith("goldens ") for _f, c in EXAMPLES), (README, EXAMPLES)


@pytest.mark.parametrize("command", sorted({c for c in README} | {c for _f, c in EXAMPLES if c.startswith("goldens")}))
def test_every_documented_goldens_command_parses(command):
    argv = [w for w in _argv(command) if w not in ("REV_A", "REV_B")] + \
        (["A", "B"] if " diff REV_A REV_B" in command else [])
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"documented command does not parse (exit {exc.code}): {command}")


@pytest.fixture
def sample_store(tmp_path) -> Path:
    """A small store of the sample store's kind: three trees copied out of it (whole-store verbs stay fast)."""
    from goldens import trees
    from goldens.store import GoldenStore

    store = GoldenStore(tmp_path / "store")
    trees.record(store, [("sp_slabs", "replicated"), ("sp_slabs", "sharded"), ("rope_rows", "replicated"),
                         ("attn_swa_decode", "replicated")], seed=17)
    return store.root


def _run(command: str, store: Path, tmp_path: Path, *, script: bool = True) -> subprocess.CompletedProcess:
    """``command`` run through the installed ``goldens`` script, or (``script=False``) as ``python -m goldens.cli``
    from the test fork server: the same ``main`` without a fresh interpreter's imports."""
    command = command.replace("out/", f"{tmp_path}/out/").replace(".venv/bin/", "")
    words = shlex.split(command)
    words[0:1] = [str(BIN / words[0])] if script else [sys.executable, "-m", "goldens.cli"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PTO_GOLDEN_CASES")}
    env.update(PTO_GOLDEN_STORE=str(store), PTO_STORE_READ_CACHE="", COLUMNS="200")
    if "--store" in words:
        words[words.index("--store") + 1] = str(store)
    return forkserver.run(words, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


# the one documented pytest line, which tests/test_backends_doc.py runs (its contracts on the example backend)
RUN_ELSEWHERE = {"pytest contracts/test_slabs.py --backend-module docs/examples/out_of_tree_backend.py:BACKEND":
                 "tests/test_backends_doc.py::test_the_example_loads_by_module_and_by_file_path_and_passes_its_contracts"}


def test_the_example_files_commands_run_as_written(sample_store, tmp_path):
    assert EXAMPLES
    scripted = False
    for name, command in EXAMPLES:  # in order: a record before its replay
        if command in RUN_ELSEWHERE:
            continue
        assert command.startswith("goldens "), f"{name}: `{command}` is run by no test: add it here"
        proc = _run(command, sample_store, tmp_path, script=not scripted)  # the first through the script
        scripted = True
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, \
            f"{name}: `{command}` exit {proc.returncode}: {proc.stderr[-600:]}"


# the README's goldens commands that need nothing outside this repository (no checkout, no S3, no placeholder)
RUNNABLE = ("goldens show", "goldens replay -q --json --junit out/replay.xml", "goldens regen --dry-run",
            "goldens log", "goldens gc --older-than-days 30 --dry-run", "goldens export-pt sp_slabs out/data",
            "goldens import-pt out/data --case sp_slabs", "goldens record sp_slabs --wiring both --seed 17",
            "goldens replay --backend-module tests.defects.half_layer:WINDOW_ONE_PAST")


def test_the_readme_commands_that_need_only_this_repository_run_as_written(sample_store, tmp_path, monkeypatch, capsys):
    """In process (the example files above go through the script): the same parser and verbs, run from the
    repository root on the small store, `out/` under a temporary folder."""
    from goldens import cli

    shown = {re.sub(r"^\.venv/bin/", "", c) for c in README}
    missing = [c for c in RUNNABLE if c not in shown]
    assert not missing, f"the README no longer shows {missing}: update RUNNABLE"
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PTO_STORE_READ_CACHE", "")
    for command in RUNNABLE:
        argv = _argv(command.replace("out/", f"{tmp_path}/out/"))
        code = cli.main(["--store", str(sample_store), *argv])
        err = capsys.readouterr().err
        want = 1 if "WINDOW_ONE_PAST" in command else 0  # "exit 1, by design", as the README says
        assert code == want and "Traceback" not in err, f"`{command}` exit {code}: {err[-600:]}"
    assert (tmp_path / "out" / "replay.xml").is_file() and (tmp_path / "out" / "data" / "replicated").is_dir()
