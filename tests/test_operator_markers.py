"""``pytest contracts/ --operator NAME`` and ``goldens replay --operator NAME``: every contract declares the
operators it calls (``@pytest.mark.operators``), the declaration is what its code calls (read statically here, and
checked at run time by the plugin for what it asks the backend for), every operator has a run, and the selection
is exactly the declared contracts plus the trees that reach the operator."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from contracts.operators import OPERATORS, operators_reached
from pto_pytest import plugin
from tests import forkserver
from tests import operator_markers as om

ROOT = Path(__file__).resolve().parents[1]


def _declared_by_import() -> dict[str, set[str]]:
    """node-id prefix (module::test) -> operators its marks declare, read from the imported modules' marks."""
    out = {}
    for path in sorted((ROOT / "contracts").glob("test_*.py")):
        module = importlib.import_module(f"contracts.{path.stem}")
        marks = getattr(module, "pytestmark", [])
        marks = marks if isinstance(marks, list) else [marks]
        base = {a for m in marks if m.name == "operators" for a in m.args}
        for name in dir(module):
            fn = getattr(module, name)
            if not name.startswith("test_") or not callable(fn):
                continue
            ops = set(base)
            for m in getattr(fn, "pytestmark", []):
                if m.name == "operators":
                    ops |= set(m.args)
                elif m.name == "parametrize":
                    ops |= {a for v in m.args[1] for pm in getattr(v, "marks", ()) if pm.name == "operators"
                            for a in pm.args}
            out[f"contracts/{path.name}::{name}"] = ops
    return out


def test_every_contract_declares_exactly_what_its_code_calls():
    problems = [f"{t.module}::{t.name}: {p}" for t in om.contract_tests() if (p := t.problem())]
    assert not problems, "\n".join(problems)
    assert sum(1 for t in om.contract_tests() if t.declared) >= 350  # the reader found the marks at all


def test_the_reader_finds_a_missing_an_extra_and_a_computed_declaration(tmp_path, monkeypatch):
    source = '''
import pytest
from pto_pytest.plugin import op

def _helper(backend):
    return op(backend, "hc_pre")

@pytest.mark.operators("hc_post")
def test_missing(backend):
    op(backend, "hc_post")
    _helper(backend)

@pytest.mark.operators("hc_post", "lm_head")
def test_extra(backend):
    op(backend, "hc_post")

@pytest.mark.parametrize("name", ["hc_post", "lm_head"])
def test_computed(backend, name):
    op(backend, name)

def test_reference_only():
    from kernels.reference.mhc import hc_pre
    hc_pre(1, 2)
'''
    (tmp_path / "contracts").mkdir()
    (tmp_path / "contracts" / "test_seeded.py").write_text(source)
    monkeypatch.setattr(om, "ROOT", tmp_path)
    om.contract_tests.cache_clear()
    try:
        rows = {t.name: t for t in om.contract_tests()}
    finally:
        om.contract_tests.cache_clear()
    assert "its code calls ['hc_post', 'hc_pre']" in rows["test_missing"].problem()
    assert '@pytest.mark.operators("hc_post", "hc_pre")' in rows["test_missing"].problem()
    assert "declares ['hc_post', 'lm_head'], its code calls ['hc_post']" in rows["test_extra"].problem()
    assert "computed name" in rows["test_computed"].problem()
    assert rows["test_reference_only"].calls == {"hc_pre"}, "a reference called directly counts"


def test_every_operator_has_an_operator_run():
    declared = _declared_by_import()
    counts = {name: sum(name in ops for ops in declared.values()) for name in OPERATORS}
    assert not [n for n, c in counts.items() if not c], "operators no contract declares"
    assert len(OPERATORS) >= 73


def test_an_undeclared_call_fails_the_test_and_a_declared_one_passes():
    def run(declared: tuple[str, ...], asked: tuple[str, ...]):
        marks = [SimpleNamespace(args=declared)] if declared else []
        item = SimpleNamespace(nodeid="contracts/test_x.py::test_y", user_properties=[],
                               iter_markers=lambda name: iter(marks), module=SimpleNamespace(__name__="contracts.test_x"),
                               get_closest_marker=lambda name: marks[0] if marks else None,
                               config=SimpleNamespace(getoption=lambda name, default=None: default))
        gen = plugin.pytest_runtest_call(item)
        next(gen)
        for name in asked:
            plugin.uses(name)
        with contextlib.suppress(StopIteration):
            gen.send(None)

    run(("hc_post", "hc_pre"), ("hc_post",))
    run((), ())
    with pytest.raises(pytest.fail.Exception, match=r"calls operator\(s\) hc_pre that its "
                                                    r"@pytest.mark.operators\(hc_post\) does not declare"):
        run(("hc_post",), ("hc_post", "hc_pre"))
    with pytest.raises(pytest.fail.Exception, match=r"check_row_precision"):  # a judge too
        run(("hc_post",), ("check_row_precision",))


def test_unknown_operators_are_usage_errors_naming_the_closest():
    with pytest.raises(pytest.UsageError, match=r"--operator v4_gat: no such operator \(did you mean v4_gate"):
        plugin.wanted_operators(["v4_gat"])
    with pytest.raises(pytest.UsageError, match="expected an operator name"):
        plugin.wanted_operators([","])
    assert plugin.wanted_operators(["hc_pre,hc_post", "lm_head"]) == {"hc_pre", "hc_post", "lm_head"}


def test_pytest_operator_selects_exactly_the_declared_contracts_and_the_trees_that_reach_it():
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    proc = forkserver.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:xdist", "contracts/",
                           "--operator", "v4_embed_pack", "--operator", "hc_post"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    declared = _declared_by_import()
    want = {prefix for prefix, ops in declared.items() if ops & {"v4_embed_pack", "hc_post"}}
    got = {i.split("[")[0] for i in ids if "test_golden_replay" not in i}
    assert got == want, (sorted(got ^ want))
    replayed = sorted(i.split("[")[1].rstrip("]") for i in ids if "test_golden_replay" in i)
    assert "v4_embed_pack/replicated" in replayed and "v4_hc_post_pro/replicated" in replayed, replayed
    assert "up-v4_hc_post/replicated" in replayed, "a tree recorded from upstream's golden reaches its operator"
    assert "mhc_sublayer/replicated" in replayed and "v4_moe_stage/replicated" in replayed  # compositions reach it
    assert "up-v4_gate_hash/replicated" not in replayed
    assert "deselected" in proc.stdout.splitlines()[-1]


def _replay(*args) -> tuple[int, str, str]:
    from goldens import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["--store", str(ROOT / "artifacts" / "store"), "replay", "--json", *args])
    return code, out.getvalue(), err.getvalue()


def test_goldens_replay_operator_replays_the_trees_that_reach_it():
    code, out, _ = _replay("--operator", "v4_gate")
    assert code == 0, out[-1500:]
    trees = {r["case"] for r in json.loads(out)["rows"]}
    assert {"up-v4_gate_hash", "up-v4_gate_scored", "v4_moe_stage", "v4_mtp_layer"} <= trees, trees
    assert not trees & {"v4_expert_routed", "metadata", "v4_hc_post_pro"}, trees
    code, _, err = _replay("--operator", "v4_gat")
    assert code == 2 and "no such operator (did you mean v4_gate" in err, err
    code, _, err = _replay("v4_hc_post_pro", "--operator", "v4_gate")
    assert code == 2 and "no tree of the 1 selected reaches v4_gate" in err, err


def test_a_tree_reaches_the_operators_its_record_names():
    parts = {"kernels.reference.mhc.hc_pre": "x", "kernels.reference.mhc.check_hc_post": "y", "const k.V": "z"}
    assert operators_reached("hc_post", parts) == {"hc_post", "hc_pre"}
    assert operators_reached("v4_decode_metadata+hca_topk") == {"v4_decode_metadata", "hca_topk"}
    assert operators_reached("not-an-operator") == frozenset()
    tree = ast.parse((ROOT / "contracts" / "test_golden_replay.py").read_text())
    assert "_Asking" in {n.name for n in tree.body if isinstance(n, ast.ClassDef)}, \
        "the replay test checks what each replay asks the backend for"
