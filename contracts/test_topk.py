"""Indexer Top-K and hierarchical candidate contracts. Spec: §5.1-§5.3.

The backend's ``index_scores`` + ``select_topk`` selection must pass the §5.3 validity check against
the reference selection and reference scores (ties at the cutoff may legitimately differ).
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from contracts.checks.topk import (
    TopKContext,
    check_topk_overlap,
    check_topk_validity,
    selected_output_reference,
)
from contracts.separation import separates
from contracts.strategies import IndexerCase, indexer_cases
from kernels.config import FLASH, FLASH_TINY
from kernels.reference import indexer as ref
from pto_pytest.defect import shared
from pto_pytest.plugin import op

FLASH_CASES = indexer_cases(max_len=700, topk=FLASH.index_topk, heads=(FLASH.index_n_heads,),
                            dim=FLASH.index_head_dim, blocks=(FLASH.block_size,), max_tokens=2)


def _reference(inputs: dict, case: IndexerCase, width: int):
    scores = ref.index_scores(**inputs, block_size=case.block, width=width)
    sel = ref.select_topk(scores, inputs["block_table"], inputs["request_ids"], topk=case.topk, block_size=case.block)
    return scores, sel


def _ctx(inputs: dict, case: IndexerCase) -> TopKContext:
    return TopKContext(inputs["block_table"], inputs["request_ids"], inputs["compressed_lens"], case.block)


@pytest.mark.parametrize("cases", [pytest.param(indexer_cases(), id="tiny"),
                                   pytest.param(FLASH_CASES, id="flash")])
@given(data=st.data())
@pytest.mark.operators("index_scores", "select_topk")
def test_topk_selection_is_valid(backend, cases, data):
    """Backend scoring + selection pass the §5.3 validity check against the reference, at tiny and at FLASH
    index dims (32 heads x 128, Top-K 512). Spec: §5.1, §5.3."""
    case = data.draw(cases, label='case')
    inputs = case.build()
    width = int(inputs["compressed_lens"].max())
    scores, expected = _reference(inputs, case, width)
    actual_scores = op(backend, "index_scores")(**inputs, block_size=case.block, width=width)
    actual = op(backend, "select_topk")(actual_scores, inputs["block_table"], inputs["request_ids"], topk=case.topk,
                                        block_size=case.block)
    result = check_topk_validity(actual, expected, _ctx(inputs, case), scores)
    assert result.ok, result.message()


@given(case=indexer_cases())
@pytest.mark.operators("index_scores", "select_topk")
def test_topk_reference_is_sorted_compacted_and_complete(case):
    """The reference keeps min(topk, visible) rows, in logical order, left-compacted, -1 padded."""
    inputs = case.build()
    width = int(inputs["compressed_lens"].max())
    scores, sel = _reference(inputs, case, width)
    ctx = _ctx(inputs, case)
    assert check_topk_validity(sel, sel.clone(), ctx, scores).ok
    for t in range(sel.shape[0]):
        rows = [int(v) for v in sel[t] if v >= 0]
        assert len(rows) == min(case.topk, int(inputs["compressed_lens"][t])), f"token {t}: {len(rows)} rows"
        logical = ctx.logical_of(t)
        pos = [logical[v] for v in rows]
        assert pos == sorted(pos) and all(v >= 0 for v in sel[t, : len(rows)].tolist())


def _tie_case():
    """One token, 6 visible positions, topk 3, a tie between positions 2 and 5 at the cutoff."""
    table = torch.tensor([[3]], dtype=torch.int32)
    ctx = TopKContext(table, torch.tensor([0]), torch.tensor([6]), 8)
    scores = torch.tensor([[9.0, 1.0, 5.0, 7.0, 0.5, 5.0]])
    phys = [3 * 8 + j for j in range(6)]
    expected = torch.tensor([[phys[0], phys[2], phys[3]]], dtype=torch.int32)
    return ctx, scores, phys, expected


def test_topk_tied_cutoff_swap_is_accepted():
    """Taking position 5 (tied with 2 at the cutoff) instead of 2 is a legal selection. Spec: §5.3 step 6."""
    ctx, scores, phys, expected = _tie_case()
    alt = torch.tensor([[phys[0], phys[3], phys[5]]], dtype=torch.int32)
    result = check_topk_validity(alt, expected, ctx, scores)
    assert result.ok, result.message()
    near = scores.clone()
    near[0, 5] = 5.0 - 0.9 * (5e-5 + 1.5e-2 * 5.0)  # within the cutoff tolerance
    assert check_topk_validity(alt, expected, ctx, near).ok


@pytest.mark.parametrize("alt, why", [
    ([0, 3, 4], "cutoff swap beyond tolerance"),  # 0.5 for 5.0
    ([2, 3, 5], "cutoff swap beyond tolerance"),  # drops the best (9.0)
    ([0, 2, 2], "row selected twice"),
    ([0, 3, 2], "strictly increase"),
], ids=["low-for-cutoff", "drop-best", "duplicate", "order"])
def test_topk_other_swaps_are_rejected(alt, why):
    ctx, scores, phys, expected = _tie_case()
    result = check_topk_validity(torch.tensor([[phys[j] for j in alt]], dtype=torch.int32), expected, ctx, scores)
    assert not result.ok and why in result.message() and "rank0" in result.message(), result.message()


def test_topk_structural_violations_are_named():
    ctx, scores, phys, expected = _tie_case()
    cases = {
        "padding": ([phys[0], -1, phys[3]], "followed by a valid row"),
        "below": ([phys[0], phys[2], -2], ">= -1"),
        "outside": ([phys[0], phys[2], 7 * 8], "outside its request"),
        "count": ([phys[0], phys[2], -1], "nominal count"),
    }
    for name, (row, text) in cases.items():
        result = check_topk_validity(torch.tensor([row], dtype=torch.int32), expected, ctx, scores)
        assert not result.ok and text in result.message(), f"{name}: {result.message()}"
    result = check_topk_validity(expected.to(torch.int64), expected, ctx, scores)
    assert not result.ok and "layout" in result.message()


def test_topk_overlap_variant():
    a = torch.tensor([list(range(100))])
    b = a.clone()
    b[0, 0] = 500
    assert check_topk_overlap(b, a).ok  # 99 % overlap
    b[0, 1] = 501
    b[0, 2] = 502
    assert not check_topk_overlap(b, a).ok  # 97 %
    b = a.clone()
    b[0, 1] = 0
    assert "duplicate" in check_topk_overlap(b, a).message()


def test_invalid_selection_cannot_define_the_reference():
    ctx, scores, phys, expected = _tie_case()
    bad = torch.tensor([[phys[0], phys[0], phys[3]]], dtype=torch.int32)
    validity = check_topk_validity(bad, expected, ctx, scores)
    with pytest.raises(ValueError, match="cannot define the output reference"):
        selected_output_reference(bad, validity, "reference caches", lambda sel, caches: sel)
    alt = torch.tensor([[phys[0], phys[3], phys[5]]], dtype=torch.int32)
    seen = []
    out = selected_output_reference(alt, check_topk_validity(alt, expected, ctx, scores), "reference caches",
                                    lambda sel, caches: seen.append(caches) or sel.float())
    assert seen == ["reference caches"] and torch.equal(out, alt.float())


@given(case=indexer_cases(), seed=st.integers(0, 2**31))
@pytest.mark.operators("index_scores", "select_topk")
def test_topk_page_permutation_changes_physical_ids_not_logical_selection(backend, case, seed):
    """Relabelling physical pages (keys move with them) changes only the physical ids. Spec: §2.1, §5.1."""
    inputs = case.build()
    width = int(inputs["compressed_lens"].max())
    score_fn, select = op(backend, "index_scores"), op(backend, "select_topk")
    base = select(score_fn(**inputs, block_size=case.block, width=width), inputs["block_table"],
                  inputs["request_ids"], topk=case.topk, block_size=case.block)
    n_pages = inputs["keys"].shape[0] // case.block
    perm = list(range(n_pages))
    random.Random(seed).shuffle(perm)
    perm_t = torch.tensor(perm)
    table = inputs["block_table"]
    moved_table = torch.where(table >= 0, perm_t[table.clamp_min(0).long()].to(table.dtype), table)
    keys = torch.empty_like(inputs["keys"])
    keys.view(n_pages, case.block, -1)[perm_t] = inputs["keys"].view(n_pages, case.block, -1)
    moved_inputs = {**inputs, "block_table": moved_table, "keys": keys}
    moved = select(score_fn(**moved_inputs, block_size=case.block, width=width), moved_table,
                   inputs["request_ids"], topk=case.topk, block_size=case.block)
    mapped = torch.where(base >= 0, perm_t[(base.clamp_min(0) // case.block).long()] * case.block
                         + base.clamp_min(0) % case.block, base).to(torch.int32)
    assert torch.equal(moved, mapped), "selection changed beyond the physical relabelling"


@given(case=indexer_cases(), data=st.data())
@pytest.mark.operators("candidate_blocks", "index_scores", "select_topk")
def test_candidate_mask_keeps_the_last_visible_block(backend, case, data):
    """The block holding compressed_len-1 is always selected; at most topk_blocks blocks; empty tokens get
    an all-zero mask; a reindex selection stays inside the mask. Spec: §5.2."""
    inputs = case.build()
    width = max(int(inputs["compressed_lens"].max()), 1)
    scores = ref.index_scores(**inputs, block_size=case.block, width=width)
    topk_blocks = data.draw(st.integers(1, 3), label='topk_blocks')
    mask = op(backend, "candidate_blocks")(scores, inputs["compressed_lens"], block=8, topk_blocks=topk_blocks,
                                           width=width)
    assert mask.dtype == torch.uint8 and tuple(mask.shape) == (scores.shape[0], width)
    for t, n in enumerate(inputs["compressed_lens"].tolist()):
        if n == 0:
            assert not bool(mask[t].any()), f"token {t} with no visible position has candidates"
            continue
        last = (n - 1) // 8
        assert bool(mask[t, last * 8: min(last * 8 + 8, width)].all()), f"token {t}: last visible block {last} dropped"
        assert int(mask[t].sum()) <= topk_blocks * 8
    re_scores = ref.index_scores(**inputs, block_size=case.block, width=width, candidates=mask)
    sel = ref.select_topk(re_scores, inputs["block_table"], inputs["request_ids"], topk=case.topk,
                          block_size=case.block)
    ctx = _ctx(inputs, case)
    for t in range(sel.shape[0]):
        logical = ctx.logical_of(t)
        for v in sel[t].tolist():
            if v >= 0:
                assert mask[t, logical[v]] == 1, f"reindex token {t} selected logical {logical[v]} outside the mask"


@pytest.mark.operators("candidate_blocks")
def test_candidate_selection_smoke_at_flash_size(backend):
    """2050*8 descending scores: the last 8 positions are kept and at most 2048*8 are selected (IX-05)."""
    width = 2050 * 8
    scores = torch.arange(width, 0, -1, dtype=torch.float32).reshape(1, width)
    mask = op(backend, "candidate_blocks")(scores, torch.tensor([width]), block=FLASH.candidate_block_size,
                                           topk_blocks=FLASH.candidate_topk_blocks, width=width)
    assert bool(mask[0, -8:].all()) and int(mask.sum()) <= 2048 * 8 and bool(mask[0, :8].all())

    def blocks(kept):  # a mask keeping these 8-position blocks
        m = torch.zeros_like(mask)
        for b in kept:
            m[0, b * 8:(b + 1) * 8] = 1
        return m

    # the block of the last visible position is forced in and takes one of the 2048 places: blocks 0..2046 and
    # 2049; separated from the plain top 2048 (0..2047), from the forced block added on top (0..2047 and 2049),
    # and from keeping every block of a row over budget
    separates("IX-05 the last block is kept within the budget", blocks([*range(2047), 2049]),
              plain_top_k=blocks(range(2048)),
              forced_block_on_top=blocks([*range(2048), 2049]), every_block=torch.ones_like(mask))
    assert torch.equal(mask, blocks([*range(2047), 2049]))


@pytest.mark.operators("index_scores")
def test_indexer_scores_round_at_the_spec_boundaries():
    """One head, one key: score = bf16(bf16(relu(bf16(q.k)) * w)) exactly. The dot 3 + 0.251953125 rounds to
    BF16 3.25, so the score is 2.265625; a dot kept in FP32 gives 2.28125 (1/3 in place of 0.25195 rounded the
    same both ways: it separated nothing). Spec: §5.1 steps 3-5."""
    q = torch.tensor([[[1.0, 0.251953125]]]).to(torch.bfloat16)
    k = torch.tensor([[3.0, 1.0]]).to(torch.bfloat16)
    w = torch.tensor([[0.7]]).to(torch.bfloat16)
    s = ref.index_scores(q, w, k, torch.tensor([[0]], dtype=torch.int32), torch.tensor([0]),
                               torch.tensor([1]), block_size=FLASH_TINY.block_size)
    from contracts.separation import separates

    def score(dot_bf16=True, product_bf16=True):
        dot = (q.float() * k.float()).sum()
        dot = dot.to(torch.bfloat16).float() if dot_bf16 else dot
        p = torch.relu(dot) * w.float()
        return (p.to(torch.bfloat16).float() if product_bf16 else p).to(torch.bfloat16).float().reshape(())

    want = separates("the dot rounded to BF16 before the weight", score(), dot_kept_fp32=score(dot_bf16=False))
    assert float(s[0, 0]) == float(want)


def test_topk_decode_c1a_variant_skips_order_and_padding_rules():
    """Decode C1A applies count, duplicate, request and tie rules but not order/trailing -1 (IX-09)."""
    ctx, scores, phys, expected = _tie_case()
    shuffled = torch.tensor([[phys[3], phys[0], phys[2]]], dtype=torch.int32)
    assert not check_topk_validity(shuffled, expected, ctx, scores).ok
    assert check_topk_validity(shuffled, expected, ctx, scores, order=False, trailing=False).ok
    dup = torch.tensor([[phys[3], phys[3], phys[2]]], dtype=torch.int32)
    assert not check_topk_validity(dup, expected, ctx, scores, order=False, trailing=False).ok


def test_index_head_weights_round_at_the_spec_boundaries():
    """w = bf16(bf16(x @ weights_proj) * dim^-0.5 * heads^-0.5). Spec: §5.1 step 2."""
    g = torch.Generator().manual_seed(0)
    x, proj = torch.randn((3, 16), generator=g), torch.randn((16, 4), generator=g)
    w = ref.index_head_weights(x, proj, heads=4, dim=32)
    first = (x.double() @ proj.double()).float().to(torch.bfloat16).float()
    assert torch.equal(w, (first * 32 ** -0.5 * 4 ** -0.5).to(torch.bfloat16).float())


def test_reuse_takes_the_source_selection_as_given():
    """REUSE copies the source layer's selection as given (no re-sort, no re-padding, no dtype change), into its own
    storage. Separated from a re-sorted selection (-1 first), from the valid rows compacted to the front, and from
    the source's INT64 widening."""
    source = torch.tensor([[9, -1, 5, -1]], dtype=torch.int32)
    reused = ref.reuse_topk(source)
    separates("IX-15 REUSE takes the source selection as given", source.clone(), resorted=source.sort(-1).values,
              compacted=torch.tensor([[9, 5, -1, -1]], dtype=torch.int32), widened=source.long())
    assert torch.equal(reused, source) and reused.data_ptr() != source.data_ptr()


def _f32(x: float) -> float:
    import struct

    return struct.unpack("<f", struct.pack("<f", x))[0]


def _bf16(x: float) -> float:
    """Round to FP32, then to BF16 with ties to even, on the bits (independent of torch's casts)."""
    import struct

    bits = struct.unpack("<I", struct.pack("<f", _f32(x)))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


@pytest.mark.operators("index_scores")
def test_index_scores_round_at_each_spec_boundary(backend):
    """Hand-computed scores pin every rounding step of §5.1, each separated from its alternative (computed
    here with the same loop): key A's head-0 dot 1 + 2^-8 + 2^-30 is FP32 1 + 2^-8, then the BF16 tie 1.0 (one
    rounding from the wider sum gives 1 + 2^-7; keeping FP32 moves the score); head 3's weight -1 makes ReLU
    before the weight give 0 where after it gives 1; key B's head-0 product 1.4375 · 0.69921875 rounds to BF16
    1.0078125 and head 3's -1 cancels it, so the FP32 head sum keeps the product's rounding visible (a BF16
    running head sum, or a product kept in FP32, gives another score). Spec: §5.1 steps 3-5 (IX-02)."""
    q = torch.tensor([[[1.0, 2.0**-8, 2.0**-30, 0.0], [2.0**-8, 0.0, 0.0, 0.0], [0.0, 0.0, 2.0**-8, 0.0],
                       [0.0, 0.0, 0.0, 1.0]]], dtype=torch.float64).to(torch.bfloat16)
    keys = torch.tensor([[1.0, 1.0, 1.0, -1.0], [1.4375, 0.0, 0.0, 1.0], [-1.0, 0.0, 0.0, 0.0]],
                        dtype=torch.float64).to(torch.bfloat16)
    w = torch.tensor([[0.7, 1.0, 1.0, -1.0]]).to(torch.bfloat16)  # head 3's negative weight: ReLU before it matters
    wq = [float(v) for v in w[0].float()]
    qv = [[float(v) for v in head] for head in q[0].float()]
    kv = [[float(v) for v in row] for row in keys.float()]

    def scores(dot_round=_bf16, relu_first=True, product_round=_bf16, head_sum="fp32"):
        out = []
        for row in kv:
            heads = []
            for h in range(4):
                dot = dot_round(sum(a * b for a, b in zip(qv[h], row, strict=True)))
                heads.append(product_round(max(dot, 0.0) * wq[h] if relu_first else max(dot * wq[h], 0.0)))
            if head_sum == "fp32":
                out.append(_bf16(sum(heads)))
            else:  # a BF16 running sum
                acc = 0.0
                for v in heads:
                    acc = _bf16(acc + v)
                out.append(acc)
        return torch.tensor(out)

    from contracts.separation import bf16_once, separates

    def once(x: float) -> float:  # FP64 -> BF16 in one rounding (no FP32 stage)
        return float(bf16_once(x))

    want = separates("§5.1: dot FP32 then BF16, ReLU, weight, BF16, FP32 head sum, BF16", scores(),
                     dot_kept_fp32=scores(dot_round=float), dot_rounded_once_from_fp64=scores(dot_round=once),
                     relu_after_the_weight=scores(relu_first=False), product_kept_fp32=scores(product_round=float),
                     head_sum_in_bf16=scores(head_sum="bf16")).tolist()
    table = torch.tensor([[0]], dtype=torch.int32)
    got = op(backend, "index_scores")(q, w, keys, table, torch.tensor([0]), torch.tensor([3]),
                                      block_size=FLASH_TINY.block_size, width=3)
    assert got.dtype == torch.float32, f"scores dtype {got.dtype}, expected FP32"
    assert got[0].tolist() == want, f"scores {got[0].tolist()}, hand-computed {want} (§5.1 rounding steps)"


@pytest.mark.operators("candidate_blocks")
def test_candidate_blocks_accept_every_tie_order_and_nothing_else():
    """Upstream picks candidate blocks with torch.topk, whose order among equal scores is implementation-defined.
    Blocks of 2: maxima 5, 1, 5, 2, the last block (3) forced; topk_blocks = 2 leaves one place, for which blocks 0
    and 2 tie at 5.0: keeping either is legal (the reference's stable rule keeps 0). Keeping block 1 (below the
    cutoff), dropping the forced block, keeping three blocks or half a block is rejected. Spec: §5.2."""
    from contracts.checks.topk import check_candidate_blocks

    scores = torch.tensor([[5.0, 0.0, 1.0, 0.0, 5.0, 0.0, 2.0, 0.0]])
    lens = torch.tensor([8])
    ref_mask = ref.candidate_blocks(scores, lens, block=2, topk_blocks=2)

    def mask(*blocks):
        m = torch.zeros(1, 8, dtype=torch.uint8)
        for b in blocks:
            m[0, 2 * b:2 * b + 2] = 1
        return m

    assert torch.equal(ref_mask, mask(3, 0)), ref_mask.tolist()
    for ok in (mask(3, 0), mask(3, 2)):
        r = check_candidate_blocks(ok, scores, lens, block=2, topk_blocks=2)
        assert r.ok, r.message()
    half = mask(3, 0)
    half[0, 1] = 0
    for bad, needle in ((mask(3, 1), "block 1 kept"), (mask(0, 2), "block 3 dropped"), (mask(3, 0, 2), "3 blocks kept"),
                        (half, "whole")):
        r = check_candidate_blocks(bad, scores, lens, block=2, topk_blocks=2)
        assert not r.ok and needle in r.message(), r.message()


# defects of tests/defects these contracts must catch (shared with other contract files)
SEEDED_DEFECTS = [
    shared("reference:TOPK_DUPLICATE", "test_topk_selection_is_valid", "row selected twice"),
    shared("reference:TOPK_HOLE", "test_topk_selection_is_valid", "followed by a valid row"),
    shared("reference:TOPK_REVERSED", "test_topk_selection_is_valid", "strictly increase"),
    shared("reference:TOPK_OUTSIDE", "test_topk_selection_is_valid", "outside its request"),
    shared("reference:TOPK_CUTOFF_SWAP", "test_topk_selection_is_valid", "cutoff swap beyond tolerance"),
    shared("reference:TOPK_LOGICAL_IDS", "test_topk_page_permutation_changes_physical_ids_not_logical_selection", "selection changed"),
    shared("reference:CANDIDATES_NO_FORCE", "test_candidate_mask_keeps_the_last_visible_block", "dropped"),
    shared("reference:CANDIDATES_NO_FORCE", "test_candidate_selection_smoke_at_flash_size", "assert"),
]
