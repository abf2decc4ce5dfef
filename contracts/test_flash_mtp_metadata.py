"""Flash-MTP's decode metadata (``flash_mtp_decode_metadata``, upstream's ``decode_prepare.py``, which has no golden):
dspark's decode metadata but for the compressed rows, which sit on HCA and CSA tables of their own at the Flash page
(the rows of one block: block_size / ratio). Judged against the rule as decode_prepare.py states it (the source block
p // block_size, its storage offset (p % block_size) // ratio), written here in tensor arithmetic, on random steps;
a hand vector separates it from dspark's page and from the other compressor's table; dspark's operator on the same
step agrees on every output but the compressed rows. Spec: §8."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.separation import separates
from kernels.errors import ContractInputError
from kernels.v4.dspark_metadata import FLASH_MTP_TABLES, OUTPUTS, TABLES
from pto_pytest.defect import SeededDefect
from pto_pytest.plugin import op

COMPRESSED = ("hca_cmp_slot_mapping", "csa_cmp_slot_mapping", "csa_idx_slot_mapping")


def _call(backend, i, **kw):
    return op(backend, "flash_mtp_decode_metadata")(*(i[k] for k in ("position_ids", *FLASH_MTP_TABLES,
                                                                    "block_counts")), **kw)


def _compressed(i, *, seq, block_size):
    """decode_prepare.py's compressed slots: at a close of ratio r, the table's page (p // bs) % count of the
    group, times bs / r, plus (p % bs) // r; -1 elsewhere."""
    p = i["position_ids"].to(torch.int64)
    req = torch.arange(p.numel()) // seq
    counts = i["block_counts"].to(torch.int64)
    bs = block_size

    def slot(name, g, ratio):
        page = i[name].to(torch.int64)[req, (p // bs) % counts[req, g]]
        return torch.where((p + 1) % ratio == 0, page * (bs // ratio) + (p % bs) // ratio, torch.full_like(p, -1))

    return {"hca_cmp_slot_mapping": slot("hca_cmp_block_table", 1, 128),
            "csa_cmp_slot_mapping": slot("csa_cmp_block_table", 2, 4),
            "csa_idx_slot_mapping": slot("idx_block_table", 3, 4)}


def _step(data, seq, b, bs, window, seed):
    g = torch.Generator().manual_seed(seed)
    starts = torch.tensor(data.draw(st.lists(st.integers(0, 3000), min_size=b, max_size=b), label="starts"))
    positions = (starts[:, None] + torch.arange(seq)[None, :]).reshape(-1).to(torch.int32)
    widths = (-(-(int(positions.max()) + 1) // bs), 6, 6, 6, 6, 6, 6)
    i = {"position_ids": positions}
    for gi, (name, width) in enumerate(zip(FLASH_MTP_TABLES, widths, strict=True)):
        i[name] = (torch.randperm(b * width, generator=g).reshape(b, width) + 1000 * gi).to(torch.int32)
    i["block_counts"] = torch.tensor(data.draw(st.lists(st.lists(st.integers(1, 6), min_size=7, max_size=7),
                                                        min_size=b, max_size=b), label="counts"), dtype=torch.int32)
    return i


@pytest.mark.operators("flash_mtp_decode_metadata", "dspark_decode_metadata")
@given(seq=st.integers(1, 3), b=st.integers(1, 3), bs=st.sampled_from([128, 256]), window=st.integers(1, 9),
       data=st.data(), seed=st.integers(0, 2**31))
def test_the_compressed_rows_sit_at_the_flash_page_and_the_rest_is_dsparks(backend, seq, b, bs, window, data, seed):
    """Random steps (1-3 requests of 1-3 tokens anywhere in 0 .. 3000, pages of 128 or 256, ring counts 1 .. 6 per
    group): the HCA, CSA and index-key slots are decode_prepare.py's (source block, storage offset), worked out
    here; every other output equals dspark_decode_metadata's on the same step with its one compressed table the
    CSA table and its counts without the HCA column."""
    i = _step(data, seq, b, bs, window, seed)
    out = _call(backend, i, seq=seq, block_size=bs, window=window)
    want = _compressed(i, seq=seq, block_size=bs)
    for name in COMPRESSED:
        bad = out[name] != want[name]
        assert not bool(bad.any()), f"{name}[{int(bad.nonzero()[0])}] = {int(out[name][bad][0])}, expected " \
                                    f"{int(want[name][bad][0])} (the Flash page, §8)"
    dspark = {**{name: i[name] for name in ("position_ids", "ori_block_table", "idx_block_table",
                                           "hca_state_block_table", "csa_state_block_table",
                                           "csa_inner_state_block_table")},
              "cmp_block_table": i["csa_cmp_block_table"], "block_counts": i["block_counts"][:, [0, 2, 3, 4, 5, 6]]}
    other = op(backend, "dspark_decode_metadata")(*(dspark[k] for k in ("position_ids", *TABLES, "block_counts")),
                                                  seq=seq, block_size=bs, window=window)
    for name in OUTPUTS:
        if name in COMPRESSED:
            continue
        assert torch.equal(out[name], other[name]), f"{name} is not dspark's on the same step (§8)"


@pytest.mark.operators("flash_mtp_decode_metadata")
def test_a_hand_vector_separates_the_flash_page_from_dsparks_and_the_tables(backend):
    """Position 383 of one request, pages of 128, counts 2 (hca_cmp) and 3 (csa_cmp, idx): the source block 383 // 128
    = 2; HCA closes (384 % 128 = 0) with page (2 % 2 = 0) -> 10 · 1 + 0 = 10, not dspark's page of 128 rows
    (row 2 on page (2 // 128) % 2 = 0: 10 · 128 + 2 = 1282) nor the CSA table (20 · 1 = 20); CSA closes (384 % 4 = 0)
    at (2 % 3 = 2) -> 22 · 32 + 127 // 4 = 735, not dspark's (row 95 on page 0: 20 · 128 + 95 = 2655) nor the HCA
    count's ring (page 0: 20 · 32 + 31 = 671); its index key 32 · 32 + 31 = 1055."""
    i = {"position_ids": torch.tensor([383], dtype=torch.int32),
         **{name: (torch.arange(4, dtype=torch.int32) + 10 * g)[None] for g, name in enumerate(FLASH_MTP_TABLES)}}
    i["ori_block_table"] = torch.arange(4, dtype=torch.int32)[None]
    i["block_counts"] = torch.tensor([[1, 2, 3, 3, 4, 4, 4]], dtype=torch.int32)
    want = {"hca_cmp_slot_mapping": 10, "csa_cmp_slot_mapping": 735, "csa_idx_slot_mapping": 1055}
    separates("the HCA slot", torch.tensor(10), dspark_page=torch.tensor(1282), csa_table=torch.tensor(20))
    separates("the CSA slot", torch.tensor(735), dspark_page=torch.tensor(2655), hca_count=torch.tensor(671))
    computed = _compressed(i, seq=1, block_size=128)
    for name, value in want.items():
        assert int(computed[name][0]) == value, f"the hand vector's {name} is not the rule: {computed[name].tolist()}"
    out = _call(backend, i, seq=1, block_size=128, window=3)
    for name, value in want.items():
        assert int(out[name][0]) == value, f"{name} = {int(out[name][0])}, expected {value} (§8)"


@pytest.mark.operators("flash_mtp_decode_metadata")
@pytest.mark.parametrize("case, field, index", [
    ("a page of 64", "block_size", None), ("dspark's six counts", "block_counts", None),
    ("an unmapped HCA page", "hca_cmp_block_table", (0, 0)),
    ("a negative position after position 0", "position_ids", (1,)),
    ("the second request's CSA count 0", "block_counts", (1, 2))])
def test_a_bad_flash_mtp_step_is_refused_naming_its_field(backend, case, field, index):
    """A page that does not hold whole compressed rows of both ratios, dspark's six counts, an unmapped page the
    step reads (HCA at a close), a negative position behind a valid one (position 0), and a bad count of the second
    request only are refused naming the field and, where it has one, the row."""
    i = {"position_ids": torch.tensor([127, 3], dtype=torch.int32),
         **{name: (torch.arange(4, dtype=torch.int32) + 10 * g).repeat(2, 1)
            for g, name in enumerate(FLASH_MTP_TABLES)},
         "block_counts": torch.tensor([[1, 2, 3, 3, 4, 4, 4]] * 2, dtype=torch.int32)}
    bs = 64 if case == "a page of 64" else 128
    if case == "dspark's six counts":
        i["block_counts"] = i["block_counts"][:, :6]
    elif case == "an unmapped HCA page":
        i["hca_cmp_block_table"] = i["hca_cmp_block_table"] * 0 - 1
    elif case == "a negative position after position 0":
        i["position_ids"] = torch.tensor([0, -1], dtype=torch.int32)
    elif case == "the second request's CSA count 0":
        i["block_counts"][1, 2] = 0
    with pytest.raises(ContractInputError) as exc:
        _call(backend, i, seq=1, block_size=bs, window=3)
    assert exc.value.field == field, f"{case}: refused naming {exc.value.field!r}: {exc.value}"
    assert index is None or exc.value.index == index, f"{case}: refused at {exc.value.index}, not {index}"


# --- seeded defects ------------------------------------------------------------------------------------------

def _dspark_page(*args, block_size, **kw):
    """The compressed rows on dspark's page of block_size rows (row p // ratio, ringed by block_size)."""
    from kernels.v4 import dspark_metadata as m

    tables, counts = args[1:8], args[8]
    m._check(args[0], tables, counts, seq=kw["seq"], block_size=block_size, window=kw["window"], pages=(8, 2),
             groups=m.FLASH_MTP_GROUPS)
    bs = block_size
    return m._lowered(args[0], tables, counts, m.FLASH_MTP_TABLES, seq=kw["seq"], block_size=bs, window=kw["window"],
                      compressed=(("hca_cmp_slot_mapping", 1, 128, bs), ("csa_cmp_slot_mapping", 2, 4, bs),
                                  ("csa_idx_slot_mapping", 3, 4, bs)), states=((4, 8), (5, 2), (6, 2)))


def _hca_on_the_csa_table(*args, **kw):
    """HCA's rows written through the CSA compressed table."""
    from kernels.v4.dspark_metadata import flash_mtp_decode_metadata

    return flash_mtp_decode_metadata(args[0], args[1], args[3], *args[3:], **kw)


SEEDED_DEFECTS = [
    SeededDefect("flash-mtp-metadata:dspark-page", "flash_mtp_decode_metadata", _dspark_page,
                 "test_the_compressed_rows_sit_at_the_flash_page_and_the_rest_is_dsparks", "the Flash page"),
    SeededDefect("flash-mtp-metadata:hca-on-csa-table", "flash_mtp_decode_metadata", _hca_on_the_csa_table,
                 "test_a_hand_vector_separates_the_flash_page_from_dsparks_and_the_tables", "hca_cmp_slot_mapping"),
]
