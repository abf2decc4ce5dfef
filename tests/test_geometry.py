"""Trees at a model's own geometry, kept in a store the user names: ``goldens record --geometry flash|pro`` (never
the sample store), found again by replay, report, show, du and doctor without naming a cases module, on a local
directory and on S3 (the moto server on loopback). The Flash-geometry round trip at full size, with its figures
against torch.save / torch.load, is benchmarks/geometry.py (400-500 MB a tree: not for every CI run)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from goldens import cli
from goldens.cases import GEOMETRIES, geometry_cases, get_case

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_each_geometry_names_its_cases_at_that_geometry():
    from kernels.config import FLASH, FLASH_TINY, V4_PRO

    flash = geometry_cases("flash")
    assert len(flash) == 12 and all(n.endswith("_flash") for n in flash), flash
    for name in flash:
        case = get_case(name)
        tiny = get_case(name.removesuffix("_flash"))
        assert case.preset == FLASH.name and case.params["preset"] == FLASH.name and tiny.preset == FLASH_TINY.name
        assert (case.operator, case.wirings, case.comparators, case.inout) == \
            (tiny.operator, tiny.wirings, tiny.comparators, tiny.inout) or case.comparators is not None
    pro = geometry_cases("pro")
    assert pro and all(get_case(n).preset == V4_PRO.kernel_preset().name for n in pro), pro
    v4_flash = geometry_cases("v4-flash")
    assert "lookup_embedding_v4_flash" in v4_flash and "v4_moe_stage_v4_flash_ep2" in v4_flash, v4_flash
    assert all(n.endswith(("_v4_flash", "_v4_flash_ep2")) for n in v4_flash), v4_flash
    assert all(get_case(n).preset == ("v4-flash-ep2" if n.endswith("_ep2") else "v4-flash") for n in v4_flash)
    assert set(GEOMETRIES) == {"flash", "pro", "v4-flash", "dspark"}


def test_the_sample_store_is_refused_and_only_cases_at_the_geometry_are_taken(tmp_path):
    code, _, err = _cli("--store", str(ROOT / "artifacts" / "store"), "record", "--geometry", "flash")
    assert code == 2 and "never go into the sample store" in err and "--store s3://BUCKET/PREFIX" in err, err
    code, _, err = _cli("--store", str(tmp_path / "s"), "record", "--geometry", "pro", "metadata")
    assert code == 2 and "metadata is not a case at that geometry" in err, err
    assert not (tmp_path / "s").exists(), "a refused record wrote a store"


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_pro_geometry_tree_round_trips_and_every_reader_finds_its_case(where, tmp_path, request):
    location = request.getfixturevalue("s3_store") if where == "s3" else str(tmp_path / "store")
    code, out, err = _cli("--store", location, "record", "--geometry", "pro", "final_norm_pro")
    assert code == 0, out[-1500:] + err[-1500:]
    # a fresh registry, as in another process: the store's tree names a case of goldens.cases.pro
    code, out, err = _cli("--store", location, "replay", "--json")
    assert code == 0, out[-1500:] + err[-1500:]
    doc = json.loads(out)
    assert {r["case"] for r in doc["rows"]} == {"final_norm_pro"} and all(r["verdict"] == "PASS" for r in doc["rows"])
    code, out, err = _cli("--store", location, "report", "--out", str(tmp_path / "report"))
    assert code == 0 and (tmp_path / "report" / "index.html").is_file(), err[-1500:]
    code, out, err = _cli("--store", location, "show", "final_norm_pro")
    assert code == 0 and "v4-pro" in out, out[-1500:]
    code, out, err = _cli("--store", location, "du", "--json")
    assert code == 0 and json.loads(out)["total"]["trees"] == 1, out[-800:]
    code, out, err = _cli("--store", location, "doctor")
    assert code == 0 and "1 tree(s)" in out, out[-1500:] + err[-800:]
