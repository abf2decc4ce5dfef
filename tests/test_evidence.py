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
    a[4] = torch.tensor(1.0, dtype=torch.bfloat16)  # across zero: no step count (it would be every value between)
    rows = {m.index: m for m in mismatches(a, e)}
    assert rows[(0,)].ulps == 1 and rows[(1,)].ulps == 1 and rows[(3,)].ulps == 2
    assert rows[(4,)].ulps is None and "opposite signs" in rows[(4,)].describe()
    assert rows[(4,)].abs_diff == 2.0 and rows[(4,)].rel_diff == 2.0
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


def test_packed_fp4_is_decoded_per_element_with_format_steps():
    from kernels import quant

    codes = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 0]], dtype=torch.uint8)  # +0.5 +1 +1.5 +2 | +3 +4 +6 +0
    e = quant.pack_fp4(codes)
    changed = codes.clone()
    changed[0, 3] = 5  # +2 -> +3: one step, odd element (high nibble of byte 1)
    changed[1, 2] = 8 | 7  # +6 -> -6: across zero, 14 steps (-0 and +0 are one value)
    rows = mismatches(quant.pack_fp4(changed), e, codec="fp4x2")
    assert [m.index for m in rows] == [(0, 3), (1, 2)]
    assert (rows[0].actual, rows[0].expected, rows[0].ulps, rows[0].unit, rows[0].codes) == (3.0, 2.0, 1, "step", (5, 4))
    assert (rows[1].actual, rows[1].expected, rows[1].ulps) == (-6.0, 6.0, 14)
    assert "step=1 (codes 0x5 vs 0x4)" in rows[0].describe()
    assert mismatches(quant.pack_fp4(changed), e)[0].hex, "without the codec hint a byte is a byte"


def test_e8m0_scales_are_decoded_to_powers_of_two_with_the_code_distance():
    e = torch.tensor([127, 130, 0xFF], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    a = torch.tensor([128, 126, 0xFF], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    rows = mismatches(a, e)
    assert [(m.index, m.actual, m.expected, m.ulps, m.unit) for m in rows] == [
        ((0,), 2.0, 1.0, 1, "code"), ((1,), 0.5, 8.0, 4, "code")], "a NaN code equal to itself is no mismatch"


def test_the_cause_names_what_the_bytes_show_and_stays_silent_otherwise():
    from contracts.evidence import cause
    from kernels import quant

    codes = torch.randint(0, 16, (4, 8), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    codes[:, ::2] = (codes[:, 1::2] + 1) % 16  # no byte holds two equal nibbles, so a swap always shows
    e = quant.pack_fp4(codes)
    swapped = ((e >> 4) | (e << 4)).to(torch.uint8)
    assert cause(swapped, e, codec="fp4x2").startswith("nibbles swapped in all 16 differing bytes (first byte [0][0])")
    one = e.clone()
    one[2, 1] ^= 1
    assert cause(one, e, codec="fp4x2") == "", "one changed nibble is no swap"
    s = torch.full((4, 1), 120, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    t = s.view(torch.uint8).clone()
    t[3, 0] = 121
    assert cause(one, e, codec="fp4x2", scales=(t.view(torch.float8_e8m0fnu), s)).startswith(
        "scale byte differs in 1 of 4 groups (first [3][0]: actual 0x79, expected 0x78)")
    assert cause(one, e, codec="fp4x2", scales=(s, s)) == "scales equal; 1 payload bytes differ"
    topk = torch.tensor([[0, 1, -1], [2, -1, -1]], dtype=torch.int32)
    shifted = torch.tensor([[0, 1, -1], [2, 3, -1]], dtype=torch.int32)
    assert cause(shifted, topk) == "count differs in 1 row(s) (first row 1: 2 valid indices, expected 1)"
    assert cause(torch.tensor([[0, 2, -1]], dtype=torch.int32), torch.tensor([[0, 1, -1]], dtype=torch.int32)) == ""


def test_replay_of_a_cache_names_the_cause_and_shows_decoded_fp4(tmp_path, capsys):
    store = GoldenStore(tmp_path / "store")
    trees.record(store, [("cache_index", "replicated")], seed=1)
    base = ["--store", str(store.root), "replay", "--json", "--backend-module"]
    assert cli.main([*base, "tests.defects.quant:PUBLISH_SWAPPED_NIBBLES"]) == 1
    rows = {r["output"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["payload"]["cause"].startswith("nibbles swapped in all"), rows["payload"]
    assert rows["payload"]["evidence"][0]["unit"] == "step" and rows["payload"]["evidence"][0]["codes"]
    assert cli.main([*base, "tests.defects.quant:PUBLISH_E8M0_BIAS_128"]) == 1
    rows = {r["output"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["payload"]["cause"].startswith("scale byte differs in"), rows["payload"]
    assert rows["scale"]["verdict"] == "FAIL" and rows["scale"]["evidence"][0]["unit"] == "code"


def test_a_regen_delta_of_packed_fp4_counts_elements_and_cache_rows():
    from kernels import quant

    codes = torch.zeros(2, 128, 1, 8, dtype=torch.uint8)
    old = quant.pack_fp4(codes)
    codes[1, 5, 0, 7] = 2  # one element, +0 -> +1, in physical row 128 + 5
    codes[1, 6, 0, 0] = 8  # +0 -> -0: no value moves, but the code does
    d = trees.delta("index_payload", old, quant.pack_fp4(codes))
    assert (d.elements_changed, d.elements, d.rows_affected, d.max_abs) == (2, 2 * 128 * 8, 2, 1.0)
