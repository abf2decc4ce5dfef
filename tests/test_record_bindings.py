"""The operator records' bindings (``kernels.record``) agree with the backends that bind them: an upstream adapter
adapts the golden the record names for its folder, a bound pypto row runs the entry the record names, every record
case at a small geometry is a golden case, and -- with a pypto-lib checkout (``PYPTO_LIB_ROOT``) -- every file and
function a record names exists in its folder."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from backends.pypto.table import BINDINGS
from backends.upstream.adapters import BY_FOLDER
from kernels.record import FOLDERS, SMALL, Record, Upstream, records


def _named(record: Record, folder: str, what: str) -> str | None:
    u = record.upstream(folder)
    return getattr(u, what) or None if u else None


def test_every_adapter_adapts_the_golden_its_record_names():
    wrong = []
    for a in (a for table in BY_FOLDER.values() for a in table.values()):
        record = records().get(a.operator)
        if record is None:
            continue
        golden = _named(record, a.folder, "golden")
        if golden is None or a.upstream != f"models/{a.folder}/{golden}":
            wrong.append(f"{a.operator}: the adapter calls {a.upstream}, the record names {golden!r} for {a.folder}")
    assert not wrong, "\n".join(wrong)
    assert sum(a.operator in records() for t in BY_FOLDER.values() for a in t.values()) >= 10  # it compared


def test_every_bound_row_runs_the_entry_its_record_names():
    wrong = []
    for name, b in BINDINGS.items():
        record = records().get(name)
        if b.status != "bound" or record is None or "deepseek_v4_pro" not in b.upstream:
            continue
        entry = _named(record, "deepseek_v4_pro", "entry")
        if entry is None or entry not in b.upstream:
            wrong.append(f"{name}: bound to {b.upstream}, the record names entry {entry!r}")
    assert not wrong, "\n".join(wrong)


def test_every_small_record_case_is_a_golden_case_of_its_operator():
    from goldens.cases import cases

    known = cases()
    missing = [f"{c.name} ({g})" for r in records().values() for c in r.cases for g in c.geometries if g in SMALL
               and (c.name + ("" if g == "tiny" else "_flash_tiny")) not in known]
    assert not missing, missing
    wrong = [n for r in records().values() for c in r.cases for n in (c.name,) if n in known
             and known[n].operator != r.operator]
    assert not wrong, wrong


def test_a_binding_must_say_why_a_piece_is_missing():
    with pytest.raises(ValueError, match="say why"):
        Upstream("deepseek_v4_pro", golden="gate.py::golden_gate_core")
    with pytest.raises(ValueError, match="expected one of"):
        Upstream("deepseek_v4_1_flash", golden="a.py::b", entry="a.py::c")


def _defined(path: Path) -> set[str]:
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}


@pytest.mark.skipif(not os.environ.get("PYPTO_LIB_ROOT"), reason="needs a pypto-lib checkout (PYPTO_LIB_ROOT)")
def test_every_file_and_function_a_record_names_exists_upstream():
    """Against a real checkout: each ``file.py::function`` of every record's bindings is a function of that file
    in that folder (read with ``ast``, nothing imported)."""
    root = Path(os.environ["PYPTO_LIB_ROOT"]) / "models"
    missing, checked = [], 0
    for r in records().values():
        for folder in FOLDERS:
            for what in ("golden", "entry"):
                named = _named(r, folder, what)
                if not named:
                    continue
                file, _, fn = named.partition("::")
                path = root / folder / file
                checked += 1
                if not path.is_file() or fn not in _defined(path):
                    missing.append(f"{r.operator} {what} {folder}/{named}")
    assert not missing, "record bindings that are not in the checkout:\n" + "\n".join(missing)
    assert checked >= 20


def test_an_output_a_geometry_takes_away_is_neither_stored_nor_judged_there(tmp_path):
    """``outputs_at`` None: main's l3_moe hands back x_next alone, so at v4-flash-ep2 the MoE stage judges x_out
    only (its router and expert outputs stay judged at tiny). A record with an output taken away at tiny records
    trees without it, replays them (the argument check agrees), and keeps it everywhere else."""
    from dataclasses import replace

    from goldens import trees
    from goldens.cases.records import record_case
    from kernels.v4.moe import MOE_STAGE_RECORD

    assert MOE_STAGE_RECORD.comparators("v4-flash-ep2") == {"x_out": "fp32_ulps"}
    assert MOE_STAGE_RECORD.dropped("v4-flash-ep2") == {"ffn_out", "indices"}
    assert set(MOE_STAGE_RECORD.comparators("tiny")) == {"x_out", "ffn_out", "indices"}
    assert not MOE_STAGE_RECORD.dropped("tiny")
    cut = replace(MOE_STAGE_RECORD, outputs_at={"tiny": {"indices": None}})
    case = replace(record_case(cut, cut.cases[0], "tiny"), name="moe_without_indices")
    record, inputs, outputs = trees.build_tree(case, "replicated", 0)
    assert set(outputs) == {"x_out", "ffn_out"} and {a.name for a in record.args if a.is_output} == set(outputs)
    assert set(record.comparators) == {"x_out", "ffn_out"}
    whole = record_case(MOE_STAGE_RECORD, MOE_STAGE_RECORD.cases[0], "tiny")
    assert set(trees.build_tree(whole, "replicated", 0)[2]) == {"x_out", "ffn_out", "indices"}
    held = trees._spec_probe(case, "replicated")  # what a replay checks the stored arguments by: shapes only, no data
    assert all(t.is_meta for d in held for t in d.values() if hasattr(t, "is_meta")), "the probe keeps tensor data"
    probe = case.arg_specs(*held)
    assert [(a.name, a.direction, a.dtype) for a in probe] == [(a.name, a.direction, a.dtype) for a in record.args]
