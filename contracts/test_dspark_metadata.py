"""dspark's decode metadata (``dspark_decode_metadata``): every slot mapping and the sliding window of one decode step
from the positions, six page tables and the per-request live-page counts. Judged against an evaluation written here
with tensor arithmetic (not the reference's per-token loop), on random steps, and pinned by a hand vector that
separates each rule from its plausible slips. Its golden case and bad calls come from its record
(``kernels/v4/dspark_metadata.py``). Spec: §8."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.separation import separates
from kernels.errors import ContractInputError
from kernels.v4.dspark_metadata import OUTPUTS, TABLES
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

pytestmark = pytest.mark.operators("dspark_decode_metadata")


def _call(backend, i, **kw):
    return op(backend, "dspark_decode_metadata")(*(i[k] for k in ("position_ids", *TABLES, "block_counts")), **kw)


def _expected(i, *, seq, block_size, window, hca_page=8, csa_page=2):
    """The rule in tensor arithmetic: request = t // seq; ori slots by logical page; the window as a prefix of
    oldest-first slots; the rings ``(row // page) % count``; compressed rows only where ``(p + 1) % ratio == 0``."""
    p = i["position_ids"].to(torch.int64)
    r = torch.arange(p.numel()) // seq
    counts = i["block_counts"].to(torch.int64)
    bs = block_size

    def ring(name, g, row, page):
        return i[name].to(torch.int64)[r, (row // page) % counts[r, g]] * page + row % page

    ori = i["ori_block_table"].to(torch.int64)
    lens = torch.clamp(p + 1, max=window)
    q = p[:, None] - lens[:, None] + 1 + torch.arange(window)[None, :]  # [T, window] positions, oldest first
    inside = torch.arange(window)[None, :] < lens[:, None]
    qc = torch.minimum(q.clamp(min=0), p[:, None])  # columns past the window's length read nothing
    slots = ori[r[:, None], qc // bs] * bs + qc % bs
    never = torch.full_like(p, -1)
    return {"ori_slot_mapping": ori[r, p // bs] * bs + p % bs, "swa_slot_mapping": ori[r, p // bs] * bs + p % bs,
            "swa_indices": torch.where(inside, slots, -1).to(torch.int32), "swa_lens": lens.to(torch.int32),
            "hca_cmp_slot_mapping": torch.where((p + 1) % 128 == 0, ring("cmp_block_table", 1, p // 128, bs), never),
            "csa_cmp_slot_mapping": torch.where((p + 1) % 4 == 0, ring("cmp_block_table", 1, p // 4, bs), never),
            "csa_idx_slot_mapping": torch.where((p + 1) % 4 == 0, ring("idx_block_table", 2, p // 4, bs), never),
            "hca_state_slot_mapping": ring("hca_state_block_table", 3, p, hca_page),
            "csa_state_slot_mapping": ring("csa_state_block_table", 4, p, csa_page),
            "csa_inner_state_slot_mapping": ring("csa_inner_state_block_table", 5, p, csa_page)}


def _judge(out, want):
    for name in OUTPUTS:
        got = out[name]
        assert got.dtype == want[name].dtype or (got.dtype, want[name].dtype) == (torch.int64, torch.int64), \
            f"{name}: {got.dtype}, expected {want[name].dtype}"
        bad = (got != want[name]).reshape(got.shape[0], -1).any(1)
        assert not bool(bad.any()), f"{name}[{int(bad.nonzero()[0])}] = {got[bad][0].tolist()}, expected " \
                                    f"{want[name][bad][0].tolist()} (§8)"


@given(seq=st.integers(1, 4), b=st.integers(1, 3), bs=st.sampled_from([2, 4, 8]), window=st.integers(1, 9),
       data=st.data(), seed=st.integers(0, 2**31))
def test_every_mapping_and_the_window_follow_the_rings(backend, seq, b, bs, window, data, seed):
    """Any step (B requests of seq consecutive positions from anywhere in 0 .. 600, pages of 2 .. 8 rows, a window
    of 1 .. 9) and any live counts: every output equals the evaluation written here, element by element."""
    g = torch.Generator().manual_seed(seed)
    starts = data.draw(st.lists(st.integers(0, 600), min_size=b, max_size=b), label="starts")
    positions = torch.tensor([s + k for s in starts for k in range(seq)], dtype=torch.int32)
    width = {"ori_block_table": -(-(int(positions.max()) + 1) // bs)}
    i = {"position_ids": positions}
    counts = torch.zeros(b, 6, dtype=torch.int32)
    for gi, name in enumerate(TABLES):
        w = width.get(name, data.draw(st.integers(1, 6), label=f"{name} width"))
        i[name] = torch.randperm(b * w * 3, generator=g)[:b * w].reshape(b, w).to(torch.int32)
        counts[:, gi] = torch.tensor(data.draw(st.lists(st.integers(1, w), min_size=b, max_size=b), label="counts"))
    i["block_counts"] = counts
    _judge(_call(backend, i, seq=seq, block_size=bs, window=window), _expected(i, seq=seq, block_size=bs,
                                                                               window=window))


def _hand():
    """One request of one token at position 35; pages of 4 rows, a window of 3; ring counts cmp 2, idx 3, hca state
    3, csa state 4, inner 5 (the ori count 1 is not read)."""
    tables = {name: torch.tensor([[10 * (gi + 1) + k for k in range(10)]], dtype=torch.int32)
              for gi, name in enumerate(TABLES)}
    return {"position_ids": torch.tensor([35], dtype=torch.int32), **tables,
            "block_counts": torch.tensor([[1, 2, 3, 3, 4, 5]], dtype=torch.int32)}


def test_a_hand_vector_separates_each_rule_from_its_slips(backend):
    """Position 35, page 4, window 3. ori page 8 -> 18 · 4 + 3 = 75; the window 33, 34, 35 -> 73, 74, 75 (oldest
    first, not 75, 74, 73); CSA row 35 // 4 = 8 on ring page (8 // 4) % 2 = 0 -> 20 · 4 + 0 = 80 (not the unringed
    page 2: 88; not row (35 + 1) // 4 = 9: 81), its index key (2 % 3 = page 2) -> 32 · 4 = 128 (not the cmp count's
    ring: 120); no HCA row (36 % 128 != 0); HCA state page (35 // 8) % 3 = 1 of 8 rows -> 41 · 8 + 3 = 331 (not CSA's
    page of 2: (17 % 3 = 2) -> 42 · 2 + 1 = 85); CSA state (17 % 4 = 1) -> 51 · 2 + 1 = 103; inner (17 % 5 = 2) ->
    62 · 2 + 1 = 125."""
    i = _hand()
    want = {"ori_slot_mapping": [75], "swa_indices": [[73, 74, 75]], "swa_lens": [3], "csa_cmp_slot_mapping": [80],
            "csa_idx_slot_mapping": [128], "hca_cmp_slot_mapping": [-1], "hca_state_slot_mapping": [331],
            "csa_state_slot_mapping": [103], "csa_inner_state_slot_mapping": [125]}
    separates("oldest first", torch.tensor([73, 74, 75]), newest_first=torch.tensor([75, 74, 73]))
    separates("the cmp ring", torch.tensor(80), unringed=torch.tensor(22 * 4), next_row=torch.tensor(81))
    separates("the idx ring", torch.tensor(128), cmp_count=torch.tensor(30 * 4))
    separates("the HCA state page", torch.tensor(331), csa_page=torch.tensor(85))
    computed = _expected(i, seq=1, block_size=4, window=3)
    for name, value in want.items():
        assert computed[name].tolist() == value, f"the hand vector's {name} is not the rule: {computed[name].tolist()}"
    out = _call(backend, i, seq=1, block_size=4, window=3)
    for name, value in want.items():
        assert out[name].tolist() == value, f"{name} = {out[name].tolist()}, expected {value} (§8)"


def test_compressed_rows_are_written_only_at_a_close_and_wrap_after_the_ring(backend):
    """Positions 0 .. 1023 and 16384 .. 16511 of one-token requests (pages of 4, cmp count 2, idx count 3): CSA writes
    at positions 3, 7, ... only, HCA at 127, 255, ..., 16511 (its row 128 = 16511 // 128, not 16511 // 129 = 127);
    CSA's rows repeat with a period of 2 pages · 4 rows · ratio 4 = 32 positions and are distinct within it, the
    index keys' with 3 · 4 · 4 = 48; HCA's rows ring through the same two cmp pages."""
    p = torch.cat((torch.arange(1024), torch.arange(16384, 16512)))
    n = p.numel()
    i = {"position_ids": p.to(torch.int32),
         **{name: (torch.arange(10, dtype=torch.int32) + 16 * g).repeat(n, 1) for g, name in enumerate(TABLES)},
         "block_counts": torch.tensor([[1, 2, 3, 4, 5, 6]], dtype=torch.int32).repeat(n, 1)}
    i["ori_block_table"] = torch.arange(n * 4200).reshape(n, 4200).to(torch.int32)
    out = _call(backend, i, seq=1, block_size=4, window=4)
    for name, ratio, period in (("csa_cmp_slot_mapping", 4, 32), ("csa_idx_slot_mapping", 4, 48),
                                ("hca_cmp_slot_mapping", 128, None)):
        writes = out[name] >= 0
        assert torch.equal(writes, (p + 1) % ratio == 0), f"{name}: written at {p[writes][:4].tolist()} .."
        if not period:  # HCA: row p // 128 on the cmp ring of 2 pages
            j = p[writes] // 128
            want = ((j // 4) % 2 + 16) * 4 + j % 4
            separates("the HCA row", want, row_by_129=((p[writes] // 129 // 4) % 2 + 16) * 4 + p[writes] // 129 % 4,
                      idx_count=((j // 4) % 3 + 16) * 4 + j % 4)
            assert torch.equal(out[name][writes], want), f"{name}: rows {out[name][writes][-3:].tolist()}, expected " \
                                                         f"{want[-3:].tolist()} (row p // 128 on the cmp ring)"
            continue
        rows = out[name][writes][:256]  # positions 0 .. 1023
        if period:
            k = period // ratio
            count, base = (2, 16) if name == "csa_cmp_slot_mapping" else (3, 32)  # the group's count and pages
            j = torch.arange(rows.numel())  # the compressed row of each close
            want = ((j // 4) % count + base) * 4 + j % 4
            separates(f"the {name} ring", want, unringed=((j // 4).clamp(max=9) + base) * 4 + j % 4,
                      other_count=((j // 4) % (5 - count) + base) * 4 + j % 4)
            assert torch.equal(rows, want), f"{name}: rows {rows[:8].tolist()} .., expected {want[:8].tolist()} .."
            assert len(set(rows[:k].tolist())) == k, f"{name}: rows repeat inside the ring"
            assert torch.equal(rows[k:], rows[:-k]), f"{name}: the ring does not wrap after {period} positions"


@pytest.mark.parametrize("case, field, index", [
    ("ori page past the table", "ori_block_table", (0, 9)),
    ("unmapped cmp page", "cmp_block_table", (0, 0)),
    ("count past the idx table", "block_counts", (0, 2)),
    ("a zero count of the last group", "block_counts", (0, 5)),
    ("two-D positions", "position_ids", None),
    ("a negative position", "position_ids", (0,)),
    ("a table of another batch", "hca_state_block_table", None),
    ("counts of another shape", "block_counts", None),
    ("seq 0", "seq/block_size/window/pages", None),
])
def test_a_bad_step_is_refused_naming_the_table_and_row(backend, case, field, index):
    """A logical ori page past its table, an unmapped (-1) page the step reads, a count larger than its table and
    malformed positions are the caller's errors, refused naming the table (and the request and column)."""
    i = _hand()
    if case == "ori page past the table":
        i["position_ids"] = torch.tensor([36], dtype=torch.int32)  # ori page 9 of a 9-wide table
        i["ori_block_table"] = i["ori_block_table"][:, :9]
    elif case == "unmapped cmp page":
        i["cmp_block_table"] = i["cmp_block_table"].clone()
        i["cmp_block_table"][0, 0] = -1
    elif case == "count past the idx table":
        i["block_counts"] = torch.tensor([[1, 2, 11, 3, 4, 5]], dtype=torch.int32)
    elif case == "a zero count of the last group":
        i["block_counts"] = torch.tensor([[1, 2, 3, 3, 4, 0]], dtype=torch.int32)
    elif case == "a negative position":
        i["position_ids"] = torch.tensor([-1], dtype=torch.int32)
    elif case == "a table of another batch":
        i["hca_state_block_table"] = i["hca_state_block_table"].repeat(2, 1)
    elif case == "counts of another shape":
        i["block_counts"] = i["block_counts"][:, :5]
    elif case == "two-D positions":
        i["position_ids"] = i["position_ids"][None]
    with pytest.raises(ContractInputError) as exc:
        _call(backend, i, seq=0 if case == "seq 0" else 1, block_size=4, window=3)
    assert exc.value.field == field and (index is None or exc.value.index == index), f"{case}: refused as {exc.value}"


def test_position_0_and_int64_inputs_are_taken(backend):
    """Position 0 (the window one slot, no close) and INT64 positions, tables and counts are valid calls."""
    i = {k: v.to(torch.int64) for k, v in _hand().items()}
    i["position_ids"] = torch.tensor([0, 1], dtype=torch.int64)
    out = _call(backend, i, seq=2, block_size=4, window=3)
    want = separates("a window of one slot at position 0", torch.tensor([40, -1, -1]),
                     full_width=torch.tensor([40, 41, 42]), newest_at_the_end=torch.tensor([-1, -1, 40]))
    assert out["swa_lens"].tolist() == [1, 2] and out["swa_indices"][0].tolist() == want.tolist(), \
        f"swa {out['swa_lens'].tolist()} {out['swa_indices'].tolist()}"


def _variant(**change):
    def run(position_ids, *rest, seq, block_size, window, hca_state_page=8, csa_state_page=2):
        from kernels.v4 import dspark_metadata as m

        *tables, counts = rest
        if change.get("unringed"):  # the live count ignored: the ring never wraps
            counts = torch.stack([torch.full((counts.shape[0],), 1, dtype=counts.dtype)] +
                                 [torch.full((counts.shape[0],), t.shape[1], dtype=counts.dtype) for t in tables[1:]],
                                 1)
        if change.get("csa_state_page_8"):  # CSA's state paged as HCA's
            csa_state_page = hca_state_page
        out = m.dspark_decode_metadata(position_ids, *tables, counts, seq=seq, block_size=block_size, window=window,
                                       hca_state_page=hca_state_page, csa_state_page=csa_state_page)
        if change.get("newest_first"):
            out = dict(out)
            idx = out["swa_indices"].clone()
            for t, n in enumerate(out["swa_lens"].tolist()):
                idx[t, :n] = idx[t, :n].flip(0)
            out["swa_indices"] = idx
        return out

    return run


SEEDED_DEFECTS = [
    SeededDefect("dspark-metadata:unringed", "dspark_decode_metadata", _variant(unringed=True),
                 "test_a_hand_vector_separates_each_rule_from_its_slips", "csa_cmp_slot_mapping"),
    SeededDefect("dspark-metadata:newest-first", "dspark_decode_metadata", _variant(newest_first=True),
                 "test_every_mapping_and_the_window_follow_the_rings", "swa_indices"),
    SeededDefect("dspark-metadata:csa-state-page-8", "dspark_decode_metadata", _variant(csa_state_page_8=True),
                 "test_a_hand_vector_separates_each_rule_from_its_slips", "csa_state_slot_mapping"),
]
