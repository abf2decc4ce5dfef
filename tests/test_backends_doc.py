"""docs/backends.md is exactly what tests/backends_doc.py renders from the registries, and its out-of-tree
example loads by module and by file path and passes the contracts it is judged by. Issue: the device backend."""

from __future__ import annotations

import sys

from backends import load_backend_module
from tests import forkserver
from tests.backends_doc import DOC, ROOT, render


def test_the_committed_doc_is_generated():
    assert DOC.read_text() == render(), "docs/backends.md is stale: run `python -m tests.backends_doc`"


def test_the_example_loads_by_module_and_by_file_path_and_passes_its_contracts():
    by_path = load_backend_module("docs/examples/out_of_tree_backend.py:BACKEND")
    assert by_path.name == "example-out-of-tree" and by_path.get("sp_bounds").__name__ == "slab_bounds"
    by_module = load_backend_module("docs.examples.out_of_tree_backend:make_backend")
    assert by_module.get("sp_bounds").__module__ == "docs.examples.out_of_tree_backend"
    # the command docs/examples/out_of_tree_backend.py documents (tests/test_documented_commands.py), as
    # ``python -m pytest`` (the installed ``pytest`` script runs the same main) forked from the test fork server
    proc = forkserver.run([sys.executable, "-m", "pytest", "contracts/test_slabs.py",
                           "--backend-module", "docs/examples/out_of_tree_backend.py:BACKEND"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "sp_bounds" in proc.stdout and "failed" not in proc.stdout.split("per-operator")[-1].split("\n")[-2]
