"""``goldens import-kept``: a device run kept in one store (beside its tree) copied into another without the tree's
inputs, then judged there with the inputs rebuilt from the case module and seed. The device here is the torch
backend kept as ``torch-cpu`` on a tiny case (``v4_hc_post``); the sample store holds the real a5sim runs at
Pro geometry (tests/test_goldens.py::test_the_kept_a5sim_outputs_are_judged_again_on_every_run)."""

from __future__ import annotations

import json

import pytest

from goldens import cli, trees
from goldens.recorded import ACTUAL_ROOT, REBUILD, rebuilt_items
from goldens.store import GoldenStore

CASE, MODULE = "v4_hc_post", "goldens.cases.records"
KEPT = f"{ACTUAL_ROOT}/torch-cpu/{CASE}/replicated"


def _cli(store: GoldenStore, *argv) -> int:
    return cli.main(["--store", str(store.root), *argv])


@pytest.fixture
def stores(tmp_path):
    """(where the run was kept, an empty store to import into)."""
    device = GoldenStore(tmp_path / "device")
    trees.record(device, [(CASE, "replicated")], seed=3)
    assert _cli(device, "replay", "--backend", "torch", "--keep-actual", CASE) == 0
    sample = GoldenStore(tmp_path / "sample")
    trees.record(sample, [("sp_slabs", "replicated")], seed=1)  # a store with a tree of its own
    return device, sample


def _import(device, sample, *extra) -> int:
    return _cli(sample, "--cases-module", MODULE, "import-kept", "--from", str(device.root), *extra, CASE)


def test_an_imported_run_is_judged_with_rebuilt_inputs_and_nothing_else_is_copied(stores, capsys):
    device, sample = stores
    assert _import(device, sample) == 0
    reader = sample.reader()
    assert rebuilt_items(reader, "torch-cpu") == [(CASE, "replicated")]
    assert trees.recorded_cases(reader) == ["sp_slabs"], "the tree (its inputs) must not be copied"
    recipe = reader.group_attrs(KEPT)[REBUILD]
    assert recipe["cases_module"] == MODULE and recipe["seed"] == 3
    capsys.readouterr()
    assert _cli(sample, "replay", "--backend", "recorded:torch-cpu", "--json") == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["case"], r["output"], r["verdict"]) for r in rows] == [("sp_slabs", "*", "SKIP"),
                                                                       (CASE, "x_out", "PASS")]
    assert _cli(sample, "replay", "--backend", "recorded:torch-cpu", CASE) == 0  # named: the imported run alone


def test_a_moved_kept_output_fails_and_a_recipe_for_other_inputs_is_a_named_skip(stores, capsys):
    device, sample = stores
    assert _import(device, sample) == 0
    reader = sample.reader()
    arr, attrs = reader.read(f"{KEPT}/x_out")
    moved = arr.copy()
    moved.reshape(-1)[-1] += 1.0
    sample.commit({f"{KEPT}/x_out": (moved, {"dtype": attrs["dtype"], "shape": attrs["shape"]})}, {}, "tamper")
    assert _cli(sample, "replay", "--backend", "recorded:torch-cpu") == 1
    group = dict(sample.reader().group_attrs(KEPT))
    group[REBUILD] = {**group[REBUILD], "seed": 4}  # the builder now gives other inputs
    sample.commit({}, {KEPT: group}, "other seed")
    capsys.readouterr()
    assert _cli(sample, "replay", "--backend", "recorded:torch-cpu", "--json", CASE) == 3  # nothing ran
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["verdict"] == "SKIP" and "are not the ones torch-cpu ran on" in row["detail"], row


def test_refusals_name_the_cause_and_write_nothing(stores, capsys):
    device, sample = stores
    assert cli.main(["--store", str(sample.root), "import-kept", "--from", str(device.root), CASE]) == 2
    assert "--cases-module" in capsys.readouterr().err
    assert _import(device, sample, "--source", "nope") == 2
    assert "torch-cpu" in capsys.readouterr().err
    trees.record(device, [(CASE, "replicated")], seed=9, force=True)  # re-recorded after the run was kept
    assert _import(device, sample) == 2
    assert "ran on other inputs" in capsys.readouterr().err
    assert not sample.reader().has(ACTUAL_ROOT)
