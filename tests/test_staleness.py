"""Exact staleness: a tree is stale only when something its reference reaches changed in a way that can move
numbers, and the message names it. Renaming locals, docstrings, comments and formatting move nothing; a changed
rounding function or rounding rule makes exactly the trees that reach it stale. The end-to-end checks edit a
copy of the project's sources and replay the sample store there. Issue: goldens a kernel engineer trusts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from goldens import trees
from goldens.cases import fingerprint_parts, get_case
from goldens.fingerprint import normalised_digest
from goldens.store import GoldenStore
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]

BASE = '''
def f(x, scale):
    """Doc."""
    y = x * scale  # a comment
    for i in range(3):
        y = y + i
    return [v * 2 for v in y]
'''


def test_normalisation_ignores_locals_docstrings_comments_and_formatting_but_not_code():
    same = '''
def f(values,   factor):
    # no docstring
    acc = values * factor
    for k in range( 3 ):
        acc = acc + k
    return [w * 2 for w in acc]
'''
    assert normalised_digest(BASE) == normalised_digest(same)
    for changed in (BASE.replace("* scale", "/ scale"), BASE.replace("range(3)", "range(4)"),
                    BASE.replace("v * 2", "v * 3"), BASE.replace("def f(", "def g(")):
        assert normalised_digest(changed) != normalised_digest(BASE), changed


def test_a_changed_rounding_rule_makes_exactly_the_trees_that_read_it_stale(monkeypatch):
    """...names the entry of the rule table that changed, and leaves stale only the trees whose reference looked
    that entry up when the tree was computed (kernels.tables.watch_reads): a tree that reads the table for other
    rules stays current, and its outputs indeed do not move. Issue #24: staleness by entry."""
    from goldens.catalog import TreeRecord
    from kernels import quant

    store = GoldenStore(ROOT / "artifacts" / "store")
    reader = store.reader()
    entry = "const kernels.quant.RULES['index']"
    items = [(c, w) for c in trees.recorded_cases(reader) for w in trees.recorded_wirings(reader, c)]
    parts = {k: TreeRecord.from_attrs(reader.group_attrs(f"{k[0]}/{k[1]}"), where=k[0]).fingerprint_parts for k in items}
    table = {k for k in items if any(p.startswith("const kernels.quant.RULES[") for p in parts[k])}
    readers = {k for k in table if entry in parts[k]}
    monkeypatch.setitem(quant.RULES, "index", replace(quant.RULES["index"], tie="even"))
    stale = {k: moved for k in items if (moved := trees.staleness(reader, *k))}
    assert set(stale) == readers and ("cache_index", "replicated") in readers, sorted(stale)
    assert all(m == (f"changed {entry}",) for m in stale.values()), stale  # the entry, and nothing else
    others = table - readers  # read the table, never this entry: current, and rightly so
    assert ("cache_window", "replicated") in others and ("attn_c1a_reuse_decode", "replicated") in others, others
    for key in (("cache_window", "replicated"), ("attn_c1a_reuse_decode", "replicated"), ("attn_swa_decode",
                                                                                          "replicated")):
        t = trees.load_tree(reader, *key)  # (one of each kind: the whole set costs a minute of CI)
        assert trees.classify_change(t, trees.reference_outputs(t)).kind == "none", key  # bytes do not move
    from goldens.replay import stale_advice

    index = trees.load_tree(reader, "cache_index", "replicated")
    advice = stale_advice(index)
    assert "payload: 3/1536 codes, at most 1 FP4 code" in advice and "is safe" in advice, advice  # how far, in steps
    assert trees.classify_change(index, trees.reference_outputs(index)).kind == "rounding"  # felt by a reader


def test_a_watched_table_notes_entries_looked_up_not_names_listed():
    from kernels.tables import WatchedTable, watch_reads

    t = WatchedTable("m.T", {"a": 1, "b": 2})
    with watch_reads() as outer:
        assert sorted(t) == ["a", "b"] and "a" in t and len(t) == 2  # names only: no entry read
        assert outer == set()
        with watch_reads() as inner:
            assert t["a"] == 1 and t.get("zz") is None
        assert t.get("b") == 2
    assert inner == {"const m.T['a']"} and outer == {"const m.T['a']", "const m.T['b']"}
    with watch_reads() as walked:
        assert list(t.values()) == [1, 2]
    assert walked == {"const m.T['a']", "const m.T['b']"}
    t["a"]  # no watcher open: nothing noted, nothing kept
    assert walked == {"const m.T['a']", "const m.T['b']"}


def _project_copy(tmp_path: Path) -> Path:
    root = tmp_path / "copy"
    for part in ("kernels", "goldens", "contracts"):
        shutil.copytree(ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "artifacts" / "store", root / "artifacts" / "store",
                    ignore=shutil.ignore_patterns(".read-cache", "pto-store.lock"))
    return root


def _replay(root: Path) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", "goldens.cli", "--store", str(root / "artifacts" / "store"), "replay",
                           "rope_rows", "sp_slabs", "cache_index", "metadata"], cwd=root, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(root),
                                                       "PTO_STORE_READ_CACHE": ""})


@pytest.mark.parametrize("edit", ["rename a local", "change a rounding step"])
def test_editing_a_reference_file(tmp_path, edit):
    root = _project_copy(tmp_path)
    if edit == "rename a local":
        path = root / "kernels" / "reference" / "rope.py"
        text = path.read_text()
        path.write_text(re.sub(r"\bpos\b", "positions_so_far", text))  # a local of materialize_rope_rows
        proc = _replay(root)
        assert proc.returncode == 0 and "0 stale tree(s)" in proc.stdout, proc.stdout[-1500:] + proc.stderr[-800:]
    else:
        path = root / "kernels" / "quant.py"
        text = path.read_text()
        path.write_text(text.replace("return ((bits + 0x7FFFFF) >> 23) - 127", "return ((bits + 0x7FFFFE) >> 23) - 127"))
        proc = _replay(root)
        assert proc.returncode == 2, proc.stdout[-1500:]
        assert "1 stale tree(s) refused" in proc.stdout  # cache_index only; rope, slabs, metadata stay fresh
        assert "kernels.quant._ceil_pow2_exponent" in re.sub(r"[\s│]+", "", proc.stdout), proc.stdout[-1500:]


def test_diff_shows_record_changes_not_only_arrays(tmp_path, monkeypatch):
    from kernels import quant

    store = GoldenStore(tmp_path / "store")
    trees.record(store, [("cache_index", "replicated")], seed=2)
    before = store.log()[0].snapshot
    monkeypatch.setitem(quant.RULES, "index", replace(quant.RULES["index"], tie="even"))
    trees.regen(store, [("cache_index", "replicated")], reason="ties to even")
    rows = trees.diff_revisions(store, before, "main")
    attrs = [d for p, k, d in rows if k == "attrs"]
    assert attrs == ["fingerprint: changed const kernels.quant.RULES['index']"], rows
    assert "reason: ties to even" in store.log()[0].message and "outputs moved" in store.log()[0].message



def test_a_lambda_sharing_its_line_with_other_arguments_is_fingerprinted():
    # goldens.cases.pro's attention cases pass "lambda get, i: ...(get, i, path, PRO), {...})": that source line
    # does not parse on its own, and the walker once raised a SyntaxError traceback on it
    import goldens.cases.pro  # noqa: F401  (registers the Pro-geometry cases)

    got = fingerprint_parts(get_case("v4_attention_swa_pro"))
    assert any(k.startswith("goldens.cases.v4_attention._v4_attention_call") for k in got), sorted(got)[:5]


def _goldens(root: Path, *args: str) -> subprocess.CompletedProcess:
    return forkserver.run([sys.executable, "-m", "goldens.cli", "--store", str(root / "artifacts" / "store"), *args],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root), "PTO_STORE_READ_CACHE": "", "COLUMNS": "400"})


def test_a_reference_bug_is_not_advised_as_a_regen_and_regen_refuses_it(tmp_path):
    """An off-by-one in the RoPE row gather (idx = pos - 1): the replay's STALE row says the outputs move past
    their comparators (a bug looks like that; a rounding change does not), names the output and how far it moved,
    and does not advise a plain regen; regen refuses with exit 1 and commits nothing; --accept-moved
    records it (a rule changed on purpose). Issue: stale is not regenerate."""
    root = _project_copy(tmp_path)
    path = root / "kernels" / "reference" / "rope.py"
    text = path.read_text()
    assert "    idx = pos.clamp_min(0)\n" in text
    path.write_text(text.replace("    idx = pos.clamp_min(0)\n", "    idx = (pos - 1).clamp_min(0)\n"))
    proc = _goldens(root, "replay", "rope_rows")
    flat = re.sub(r"[\s│]+", " ", proc.stdout)
    assert proc.returncode == 2 and "OUTPUTS MOVE PAST THEIR COMPARATORS" in flat, flat[-1500:]
    assert "rope_cos (58/128 elements in 10 rows, max rel 20.7" in flat and "--accept-moved" in flat, flat
    store = GoldenStore(root / "artifacts" / "store")
    before = [e.snapshot for e in store.log()]
    proc = _goldens(root, "regen", "rope_rows")
    assert proc.returncode == 1 and "would move past their comparators" in proc.stderr, proc.stderr[-800:]
    assert "Traceback" not in proc.stderr and [e.snapshot for e in store.log()] == before
    proc = _goldens(root, "regen", "rope_rows", "--accept-moved")  # accepting a move needs a reason
    assert proc.returncode == 2 and "-m REASON" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert [e.snapshot for e in store.log()] == before
    proc = _goldens(root, "regen", "rope_rows", "--accept-moved", "-m", "rows are 1-based now")
    flat = re.sub(r"[\s│]+", " ", proc.stdout)
    assert proc.returncode == 0 and "PAST ITS COMPARATOR" in flat, proc.stdout[-800:]
    assert "accepted past its comparators rope_rows/replicated: rope_cos" in flat, flat[-800:]  # what it accepted
    assert len(store.log()) == len(before) + 1
    message = store.log()[0].message
    assert "accepted past their comparators: rope_rows/replicated" in message and "rows are 1-based now" in message


def test_a_reference_that_raises_is_one_line_naming_the_tree_exit_3(tmp_path):
    """A rounding edit that makes the reference raise (here an index past the table): replay reports an ERROR row
    naming the tree and the exception, exit 3, no traceback; regen says the same and commits nothing."""
    root = _project_copy(tmp_path)
    path = root / "kernels" / "reference" / "rope.py"
    text = path.read_text()
    path.write_text(text.replace("    idx = pos.clamp_min(0)\n", "    idx = pos.clamp_min(0) + 10**6\n"))
    proc = _goldens(root, "replay", "rope_rows", "sp_slabs")
    flat = re.sub(r"[\s│]+", " ", proc.stdout + proc.stderr)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert "rope_rows/replicated: the reference raised" in flat and "IndexError" in flat, flat[-1500:]
    store = GoldenStore(root / "artifacts" / "store")
    before = [e.snapshot for e in store.log()]
    proc = _goldens(root, "regen", "rope_rows")
    assert proc.returncode == 3 and "Traceback" not in proc.stderr and "rope_rows/replicated" in proc.stderr, \
        proc.stderr[-1500:]
    assert [e.snapshot for e in store.log()] == before


def test_a_modules_rounding_version_reaches_every_tree_that_calls_it(monkeypatch):
    """Bumping kernels/sequence_parallel.py's ROUNDING_VERSION makes sp_slabs stale, naming it (its reference
    calls that module's functions but never reads the constant)."""
    from kernels import sequence_parallel

    reader = GoldenStore(ROOT / "artifacts" / "store").reader()
    monkeypatch.setattr(sequence_parallel, "ROUNDING_VERSION", "sp-test-bump")
    tree = trees.load_tree(reader, "sp_slabs", "replicated")
    assert tree.stale and tree.moved == ("changed const kernels.sequence_parallel.ROUNDING_VERSION",), tree.moved


def test_pytest_says_how_far_a_stale_trees_outputs_move(tmp_path):
    """#48: pytest's stale failure said only "run `goldens regen NAME`"; it now says what `goldens replay` says:
    whether the outputs move within their comparators (a rounding change, regen is safe) or past them. The index
    rule's ties changed to even inside the pytest run (a plugin loaded first) make cache_index stale."""
    import subprocess
    import sys

    plugin = tmp_path / "tie_even_plugin.py"
    plugin.write_text("from dataclasses import replace\nfrom kernels import quant\n"
                      "quant.RULES['index'] = replace(quant.RULES['index'], tie='even')\n")
    env = dict(__import__("os").environ, PYTHONPATH=f"{tmp_path}{__import__('os').pathsep}{ROOT}")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tie_even_plugin",
                           "contracts/test_golden_replay.py", "-k", "cache_index and replicated"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-1500:]
    assert "cache_index/replicated is stale" in proc.stdout and "a rounding change" in proc.stdout \
        and "goldens regen cache_index` is safe" in proc.stdout, proc.stdout[-2000:]


def test_the_change_is_said_per_output_not_per_tree(monkeypatch, capsys):
    """#48: the dry run's "change" column said the tree's kind on every output row, so an output that moved one ulp
    beside one that moved past its comparator was labelled PAST ITS COMPARATOR too. rope_rows: rope_cos moved one
    ulp (a rounding change), rope_sin moved 0.25 (past its exact comparator)."""
    from goldens import cli

    reader = GoldenStore(ROOT / "artifacts" / "store").reader()
    tree = trees.load_tree(reader, "rope_rows", "replicated")
    cos, sin = tree.expected["rope_cos"], tree.expected["rope_sin"]
    outputs = {"rope_cos": cos.clone(), "rope_sin": sin.clone()}
    outputs["rope_cos"][3, 2] = float(cos[3, 2].nextafter(cos.new_tensor(9.0)))
    outputs["rope_sin"][5, 1] += 0.25
    change = trees.classify_change(tree, outputs)
    assert change.kind == "beyond" and change.of("rope_cos") == "rounding" and change.of("rope_sin") == "beyond"
    unmoved = trees.classify_change(tree, {k: v.clone() for k, v in tree.expected.items()})
    assert unmoved.kind == "none" and unmoved.of("rope_cos") == "none"

    deltas = [trees.delta(k, tree.expected[k], outputs[k]) for k in ("rope_cos", "rope_sin")]
    monkeypatch.setattr(trees, "regen", lambda *a, **k: ([("rope_rows", "replicated", deltas, change)], None))
    monkeypatch.setenv("COLUMNS", "400")
    rc = cli.main(["--store", str(ROOT / "artifacts" / "store"), "regen", "rope_rows", "--dry-run"])
    rows = {line.split("│")[3].strip(): line for line in capsys.readouterr().out.splitlines() if "rope_rows" in line}
    assert rc == 1 and "rounding" in rows["rope_cos"] and "PAST" not in rows["rope_cos"], rows
    assert "PAST ITS COMPARATOR" in rows["rope_sin"], rows
    monkeypatch.setattr(trees, "regen", lambda *a, **k: ([("rope_rows", "replicated", deltas, change)], None))
    rc = cli.main(["--store", str(ROOT / "artifacts" / "store"), "regen", "rope_rows", "--dry-run", "--json"])
    got = {d["output"]: d["change"] for d in __import__("json").loads(capsys.readouterr().out)["trees"][0]["deltas"]}
    assert rc == 1 and got == {"rope_cos": "rounding", "rope_sin": "beyond"}, got
