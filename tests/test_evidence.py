"""Evidence in every failure: the first mismatching elements with index, actual, expected, |diff|, relative
diff and ULPs in the output's dtype (integer and byte outputs as codes), through one formatting path shared by
the CLI, the pytest replay and --json. Issue: goldens a kernel engineer trusts (item 1)."""

from __future__ import annotations

import json
import re

import torch

from contracts.evidence import mismatches
from goldens import cli, trees
from goldens.store import GoldenStore


def test_ulps_count_representable_steps_in_the_output_dtype():
    e = torch.tensor([1.0, 0.0, -0.0, 1.0, -1.0], dtype=torch.bfloat16)
    a = e.clone()
    a[0] = torch.nextafter(e[:1].float(), torch.tensor([2.0])).to(torch.bfloat16)[0]  # FP32 step: rounds back
    a[0] = torch.tensor(1.0078125, dtype=torch.bfloat16)  # the next BF16 after 1.0
    a[1] = torch.tensor([1]).to(torch.int16).view(torch.bfloat16)[0]  # the smallest subnormal above 0
    a[3] = torch.tensor(1.015625, dtype=torch.bfloat16)  # two BF16 steps above 1.0
    a[4] = torch.tensor(1.0, dtype=torch.bfloat16)  # across zero: 2 * (bits of 1.0)
    rows = {m.index: m for m in mismatches(a, e)}
    assert rows[(0,)].ulps == 1 and rows[(1,)].ulps == 1 and rows[(3,)].ulps == 2
    assert rows[(4,)].ulps == 2 * 0x3F80 and rows[(4,)].abs_diff == 2.0 and rows[(4,)].rel_diff == 2.0
    assert (2,) not in rows, "-0.0 vs -0.0 is no mismatch"
    f8 = torch.tensor([448.0, 1.0], dtype=torch.float8_e4m3fn)
    g8 = torch.tensor([416.0, 1.0], dtype=torch.float8_e4m3fn)
    assert mismatches(g8, f8)[0].ulps == 1  # FP8 E4M3: 416 and 448 are neighbours


def test_integer_and_byte_outputs_show_codes_and_the_limit_holds():
    a = torch.arange(20, dtype=torch.int32).reshape(4, 5)
    e = a.clone()
    e[1:, :] += 1
    rows = mismatches(a, e, limit=4)
    assert [m.index for m in rows] == [(1, 0), (1, 1), (1, 2), (1, 3)] and rows[0].abs_diff is None
    b = torch.tensor([0x86], dtype=torch.uint8)
    assert "actual=0x86 expected=0x6f" in mismatches(b, torch.tensor([0x6F], dtype=torch.uint8))[0].describe()


def test_replay_failures_carry_the_evidence_in_text_and_json(tmp_path, capsys):
    store = GoldenStore(tmp_path / "store")
    trees.record(store, [("sp_slabs", "replicated")], seed=1)
    argv = ["--store", str(store.root), "replay", "--backend-module", "tests.defects.slabs:GATHER_REVERSED"]
    assert cli.main(argv) == 1
    assert "firstmismatches:[0][0]actual=" in re.sub(r"[\s│]+", "", capsys.readouterr().out)
    assert cli.main([*argv, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    failing = [r for r in doc["rows"] if r["verdict"] == "FAIL"]
    assert failing and all(r["evidence"] and {"index", "actual", "expected", "ulps"} <= set(r["evidence"][0])
                           for r in failing)
